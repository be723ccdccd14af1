//! Cluster-only behaviour on a real node: bootstrap is idempotent, and an index created
//! by hand with the wrong types is reported instead of written into.

use serde_json::json;

#[tokio::test]
async fn bootstrap_is_idempotent_and_reports_a_wrong_mapping() {
    let Some(url) = super::url("CAIRN_TEST_OPENSEARCH_URL") else {
        eprintln!("skipped: CAIRN_TEST_OPENSEARCH_URL is not set");
        return;
    };
    let prefix = format!("cairn-test-{}", uuid::Uuid::now_v7().simple());
    let store = cairn_store_cluster::ClusterStore::connect(&url, &prefix, 3)
        .await
        .expect("connect");
    let _cleanup = super::Indices::of(&url, &store);
    let first = store.bootstrap().await.expect("bootstrap");
    assert_eq!(first.created.len(), cairn_store_cluster::INDICES.len());
    let second = store.bootstrap().await.expect("bootstrap again");
    assert!(second.created.is_empty());
    assert_eq!(second.existing.len(), cairn_store_cluster::INDICES.len());

    // Another prefix whose facts index was made by hand: text as a keyword, no vector.
    let wrong = format!("cairn-test-{}", uuid::Uuid::now_v7().simple());
    let other = cairn_store_cluster::ClusterStore::connect(&url, &wrong, 3)
        .await
        .expect("connect");
    let _cleanup_other = super::Indices::of(&url, &other);
    let client = reqwest_free_put(
        &url,
        &format!("{wrong}-facts"),
        json!({
            "mappings": { "properties": { "text": { "type": "keyword" }, "tenant": { "type": "keyword" } } }
        }),
    )
    .await;
    assert!(client, "index created by hand");
    let error = other.bootstrap().await.expect_err("a mismatch is reported");
    let message = error.to_string();
    assert!(message.contains(&format!("{wrong}-facts")), "{message}");
    assert!(message.contains("text is keyword, expected text"), "{message}");
    assert_eq!(error.code(), "mapping_mismatch");
    use cairn_core::MemoryStore;
    let scope = cairn_store_tests::scope("acme", "alice");
    let refused = other.get_fact(&scope, "fact_x").await;
    assert!(
        matches!(refused, Err(cairn_core::Error::Unavailable(ref reason)) if reason.contains("mapping")),
        "{refused:?}"
    );
}

/// Creates an index with a plain HTTP request (std only), as an operator might by hand.
async fn reqwest_free_put(url: &str, index: &str, body: serde_json::Value) -> bool {
    let address = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let path = format!("/{index}");
    let payload = body.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(&address) else { return false };
        let request = format!(
            "PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
            payload.len()
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        // The status line is enough; the connection may stay open after the body.
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).is_ok() && &head == b"HTTP/1.1 200"
    })
    .await
    .unwrap_or(false)
}
