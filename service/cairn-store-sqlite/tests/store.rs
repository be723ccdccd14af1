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
        let event = cairn_store_tests::audit(&scope, "fact.create");
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

/// Erased text is gone from the files, not only from queries: the database's freed
/// pages are zeroed and the write-ahead log holding their earlier images is truncated.
#[tokio::test]
async fn erased_text_leaves_the_database_and_its_log() {
    use cairn_core::MemoryStore;
    let (store, directory) = fresh_store();
    let scope = cairn_store_tests::scope("acme", "alice");
    let secret = "Quetzalcoatlus-7781";
    let record = cairn_store_tests::fact(
        &format!("The user's passphrase hint is {secret}"),
        chrono::Utc::now(),
    );
    let event = |action: &str| cairn_store_tests::audit(&scope, action);
    store
        .commit(
            &scope,
            cairn_core::ChangeSet::new(event("fact.create")).with(cairn_core::Change::InsertFact(record)),
        )
        .await
        .expect("commit");
    let files_hold = |needle: &str| {
        std::fs::read_dir(directory.path())
            .expect("list")
            .filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
            .any(|bytes| {
                bytes
                    .windows(needle.len())
                    .any(|window| window == needle.as_bytes())
            })
    };
    assert!(files_hold(secret), "the text is on disk before the erasure");
    store
        .erase_scope(&scope, event("user.erase"))
        .await
        .expect("erase");
    assert!(!files_hold(secret), "no file keeps the erased text");
}

#[tokio::test]
async fn upgrading_from_version_2_indexes_episode_context() {
    use cairn_core::{Change, ChangeSet, Episode, MemoryStore, SearchFilter, TextQuery, Tier};
    let directory = tempfile::tempdir().expect("temp dir");
    let scope = cairn_store_tests::scope("acme", "alice");
    let now = chrono::Utc::now();
    let episode = |text: &str| Episode {
        id: cairn_core::new_id("epi"),
        session_id: Some("s1".into()),
        text: text.into(),
        occurred_at: now,
        ingested_at: now,
        embedding: None,
    };
    let (question, reply) = (
        episode("Which marathon are you training for?"),
        episode("The one in Lisbon."),
    );
    {
        let store = SqliteStore::open(directory.path()).expect("open");
        let event = cairn_store_tests::audit(&scope, "episode.ingest");
        store
            .commit(
                &scope,
                ChangeSet::new(event).with(Change::InsertEpisodes(vec![question.clone(), reply.clone()])),
            )
            .await
            .expect("commit");
    }
    // Put the file back into its version 2 shape: a full-text table without context, jobs
    // without dead letters, scope state without audit keys.
    {
        let connection =
            rusqlite::Connection::open(directory.path().join("cairn.sqlite3")).expect("open file");
        connection
            .execute_batch(
                "CREATE TABLE saved AS SELECT rowid AS seq, text, scope_key FROM episodes_fts;
                 DROP TABLE episodes_fts;
                 DROP INDEX episodes_session;
                 CREATE VIRTUAL TABLE episodes_fts USING fts5 (text, scope_key, tokenize = 'porter unicode61 remove_diacritics 2');
                 INSERT INTO episodes_fts (rowid, text, scope_key) SELECT seq, text, scope_key FROM saved;
                 DROP TABLE saved;
                 DROP INDEX jobs_by_tenant;
                 ALTER TABLE jobs DROP COLUMN dead_at;
                 ALTER TABLE consolidation_state DROP COLUMN audit_key;
                 UPDATE schema_meta SET value = '2' WHERE key = 'version';",
            )
            .expect("downgrade");
    }
    let store = SqliteStore::open(directory.path()).expect("reopen and migrate");
    let search = |text: &str| {
        TextQuery::new(
            SearchFilter {
                tier: Tier::Episodic,
                as_of: chrono::Utc::now(),
                include_history: false,
                fact_types: Vec::new(),
                session_id: None,
                limit: 10,
            },
            text,
        )
    };
    let ids = |hits: Vec<cairn_core::TextHit>| -> Vec<String> {
        hits.into_iter().map(|hit| hit.memory.id().to_owned()).collect()
    };
    assert_eq!(
        ids(store
            .search_text(&scope, &search("marathon"))
            .await
            .expect("search")),
        vec![question.id.clone(), reply.id.clone()]
    );
    assert_eq!(
        ids(store
            .search_text(&scope, &search("Lisbon"))
            .await
            .expect("search")),
        vec![reply.id.clone(), question.id.clone()],
        "the question is indexed with the reply that followed it"
    );
}

/// BM25 applies currency before ranking: current facts that score below thousands of
/// expired ones are still the hits.
#[tokio::test]
async fn current_facts_below_many_stale_matches_are_found() {
    use cairn_core::{Change, ChangeSet, MemoryStore, SearchFilter, TextQuery, Tier};
    let (store, _directory) = fresh_store();
    let scope = cairn_store_tests::scope("acme", "alice");
    let now = chrono::Utc::now();
    let audit = || cairn_store_tests::audit(&scope, "fact.create");
    let current: Vec<cairn_core::Fact> = ["The user drinks tea with lemon", "The user buys tea in bulk"]
        .iter()
        .map(|text| cairn_store_tests::fact(text, now - chrono::Duration::hours(1)))
        .collect();
    let search_after = |stale: usize| {
        let store = store.clone();
        let scope = scope.clone();
        let current = current.clone();
        async move {
            let mut changes = ChangeSet::new(audit());
            for index in 0..stale {
                let mut fact =
                    cairn_store_tests::fact(&format!("tea tea {index}"), now - chrono::Duration::hours(2));
                fact.expires_at = Some(now - chrono::Duration::minutes(30));
                changes = changes.with(Change::InsertFact(fact));
            }
            store.commit(&scope, changes).await.expect("insert stale facts");
            let filter = SearchFilter {
                tier: Tier::Semantic,
                as_of: now,
                include_history: false,
                fact_types: Vec::new(),
                session_id: None,
                limit: 2,
            };
            let mut found: Vec<String> = store
                .search_text(&scope, &TextQuery::new(filter, "tea"))
                .await
                .expect("search")
                .into_iter()
                .map(|hit| hit.memory.id().to_owned())
                .collect();
            found.sort();
            let mut expected: Vec<String> = current.iter().map(|fact| fact.id.clone()).collect();
            expected.sort();
            assert_eq!(found, expected, "after {stale} stale facts");
        }
    };
    let mut changes = ChangeSet::new(audit());
    for fact in &current {
        changes = changes.with(Change::InsertFact(fact.clone()));
    }
    store.commit(&scope, changes).await.expect("insert current facts");
    search_after(100).await;
    search_after(5_000).await;
}

/// Rows are numbered across tenants; page cursors must not reveal that numbering (how
/// many rows other tenants wrote between two pages), and one scope's cursor is refused
/// in another.
#[tokio::test]
async fn page_cursors_reveal_nothing_of_other_scopes() {
    use cairn_core::{Change, ChangeSet, Error, MemoryStore, PageRequest, StatusFilter};
    let (store, _directory) = fresh_store();
    let alice = cairn_store_tests::scope("acme", "alice");
    let mallory = cairn_store_tests::scope("evil", "alice");
    let event = |scope: &cairn_core::Scope| cairn_store_tests::audit(scope, "fact.create");
    let write = |scope: cairn_core::Scope, text: String| {
        let store = store.clone();
        async move {
            let fact = cairn_store_tests::fact(&text, chrono::Utc::now());
            store
                .commit(
                    &scope,
                    ChangeSet::new(event(&scope)).with(Change::InsertFact(fact)),
                )
                .await
                .expect("write");
        }
    };
    write(alice.clone(), "first".into()).await;
    for index in 0..50 {
        write(mallory.clone(), format!("noise {index}")).await;
    }
    write(alice.clone(), "second".into()).await;
    write(alice.clone(), "third".into()).await;
    let page = |cursor: Option<String>| PageRequest { limit: 1, cursor };
    let mut cursors = Vec::new();
    let mut texts = Vec::new();
    let mut cursor = None;
    loop {
        let listed = store
            .list_facts(
                &alice,
                StatusFilter::All,
                chrono::Utc::now(),
                &page(cursor.clone()),
            )
            .await
            .expect("page");
        texts.extend(listed.items.iter().map(|fact| fact.text.clone()));
        match listed.next_cursor {
            Some(next) => {
                cursors.push(next.clone());
                cursor = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(texts, ["third", "second", "first"]);
    for cursor in &cursors {
        assert!(cursor.parse::<i64>().is_err(), "not a row number: {cursor}");
        match store
            .list_facts(
                &mallory,
                StatusFilter::All,
                chrono::Utc::now(),
                &page(Some(cursor.clone())),
            )
            .await
        {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "cursor"),
            other => panic!("another scope's cursor was accepted: {other:?}"),
        }
    }
}
