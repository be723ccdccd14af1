//! The cluster store against the shared conformance suite, on real nodes: OpenSearch
//! when `CAIRN_TEST_OPENSEARCH_URL` is set, Elasticsearch 8 when
//! `CAIRN_TEST_ELASTICSEARCH_URL` is, Elasticsearch 9 when
//! `CAIRN_TEST_ELASTICSEARCH9_URL` is (`.ci/run` and `scripts/test` start all three). Each test gets its own index
//! prefix, deleted when it ends. Plus snapshots of every query body for both engines.

use cairn_store_cluster::ClusterStore;

/// Deletes the test's indices when the test ends: on its own thread with its own
/// runtime and client (drop cannot await, and a client is bound to its runtime).
struct Indices(Option<(String, String)>);

impl Indices {
    fn of(url: &str, store: &ClusterStore) -> Self {
        Indices(Some((url.to_owned(), store.prefix().to_owned())))
    }

    /// The URL of the node the indices are on.
    fn url(&self) -> String {
        self.0
            .as_ref()
            .map(|(url, _)| url.clone())
            .expect("the node's URL")
    }
}

impl Drop for Indices {
    fn drop(&mut self) {
        if let Some((url, prefix)) = self.0.take() {
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                if let Ok(runtime) = runtime {
                    let _ = runtime.block_on(async {
                        let store = ClusterStore::connect(&url, &prefix, 3).await?;
                        store.delete_indices().await
                    });
                }
            })
            .join();
        }
    }
}

/// The test cluster's URL from `variable`. A backend named in `CAIRN_TEST_BACKENDS`
/// (`scripts/test` names every backend it starts) must have one: its tests fail rather
/// than pass without running.
#[allow(clippy::disallowed_methods)]
fn url(variable: &str) -> Option<String> {
    let url = std::env::var(variable).ok().filter(|url| !url.is_empty());
    let engine = match variable {
        "CAIRN_TEST_OPENSEARCH_URL" => "opensearch",
        "CAIRN_TEST_ELASTICSEARCH9_URL" => "elasticsearch9",
        _ => "elasticsearch",
    };
    let required = std::env::var("CAIRN_TEST_BACKENDS").unwrap_or_default();
    assert!(
        url.is_some() || !required.split(',').any(|backend| backend.trim() == engine),
        "CAIRN_TEST_BACKENDS requires {engine}, but {variable} is not set"
    );
    url
}

/// A store on a fresh prefix, not bootstrapped yet, with the cluster's URL; its indices
/// are deleted when the guard drops. `None` (the test is skipped) without a cluster.
async fn unprepared(variable: &str) -> Option<(String, ClusterStore, Indices)> {
    unprepared_with(variable, 3).await
}

/// [`unprepared`] with vectors of `dimension`.
async fn unprepared_with(variable: &str, dimension: usize) -> Option<(String, ClusterStore, Indices)> {
    let Some(url) = url(variable) else {
        eprintln!("skipped: {variable} is not set");
        return None;
    };
    let prefix = format!("cairn-test-{}", uuid::Uuid::now_v7().simple());
    let store = ClusterStore::connect(&url, &prefix, dimension)
        .await
        .expect("the test cluster answers");
    let indices = Indices::of(&url, &store);
    Some((url, store, indices))
}

async fn fresh(variable: &str) -> Option<(ClusterStore, Indices)> {
    fresh_with(variable, 3).await
}

/// [`fresh`] with vectors of `dimension`.
async fn fresh_with(variable: &str, dimension: usize) -> Option<(ClusterStore, Indices)> {
    let (_, store, indices) = unprepared_with(variable, dimension).await?;
    store.bootstrap().await.expect("bootstrap");
    Some((store, indices))
}

mod opensearch {
    cairn_store_tests::conformance_suite!(match super::fresh("CAIRN_TEST_OPENSEARCH_URL").await {
        Some(pair) => pair,
        None => return,
    });
}

mod elasticsearch {
    cairn_store_tests::conformance_suite!(match super::fresh("CAIRN_TEST_ELASTICSEARCH_URL").await {
        Some(pair) => pair,
        None => return,
    });
}

mod elasticsearch9 {
    cairn_store_tests::conformance_suite!(match super::fresh("CAIRN_TEST_ELASTICSEARCH9_URL").await {
        Some(pair) => pair,
        None => return,
    });
}

#[path = "store/faults.rs"]
mod faults;
#[path = "store/operations.rs"]
mod operations;
#[path = "store/queries.rs"]
mod queries;
