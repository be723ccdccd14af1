//! The embedded store against the shared conformance suite, plus durability checks.

use cairn_store_sqlite::SqliteStore;

/// A store in a fresh temporary directory, removed when the test ends.
fn fresh_store() -> (SqliteStore, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(directory.path()).expect("open store");
    (store, directory)
}

cairn_store_tests::conformance_suite!(fresh_store());

#[tokio::test]
async fn data_survives_reopening() {
    use cairn_core::MemoryStore;
    let directory = tempfile::tempdir().expect("temp dir");
    let scope = cairn_store_tests::scope("acme", "alice");
    let record = cairn_store_tests::fact("The user speaks Welsh", chrono::Utc::now());
    {
        let store = SqliteStore::open(directory.path()).expect("open");
        let event = cairn_core::AuditEvent {
            id: cairn_core::new_id("aud"),
            at: chrono::Utc::now(),
            subject: "test".into(),
            tenant: "acme".into(),
            user: "alice".into(),
            action: "fact.create".into(),
            target_ids: vec![record.id.clone()],
            request_id: "req".into(),
            detail: serde_json::Value::Null,
        };
        store
            .commit(
                &scope,
                cairn_core::ChangeSet::new(event).with(cairn_core::Change::InsertFact(record.clone())),
            )
            .await
            .expect("commit");
    }
    let reopened = SqliteStore::open(directory.path()).expect("reopen");
    let found = reopened.get_fact(&scope, &record.id).await.expect("get");
    assert_eq!(found.map(|fact| fact.text), Some(record.text));
}
