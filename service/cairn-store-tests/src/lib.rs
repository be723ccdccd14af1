//! The store conformance suite. Each backend's tests call [`conformance_suite!`] with
//! an expression that builds a fresh, empty store; every check below then runs against
//! that backend, so all backends are held to the same behaviour.

use cairn_core::text::fingerprint;
use cairn_core::{
    AuditEvent, Change, ChangeSet, ConsolidationJob, Edge, EdgeKind, Episode, Error, Fact, FactStatus,
    FactType, Memory, MemoryStore, PageRequest, Permission, Playbook, Principal, Review, ReviewKind,
    ReviewStatus, Scope, SearchFilter, StatusFilter, TenantId, TextQuery, Tier, Tombstone, TombstoneReason,
    UseCount, VectorQuery, new_id,
};
use chrono::{DateTime, Duration, Utc};
use std::sync::Arc;

/// Generates one `#[tokio::test]` per conformance check. `$make` is an expression that
/// evaluates to `(store, guard)`: a fresh empty store and whatever must live as long as
/// it (a temporary directory, a test index prefix), dropped when the test ends.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@tests $make;
            facts_are_visible_only_in_their_scope,
            search_is_restricted_to_the_scope,
            supersession_is_owner_checked_and_atomic,
            concurrent_supersessions_let_exactly_one_win,
            tombstones_block_reinsertion_until_lifted,
            erased_facts_leave_no_trace_in_reads_or_search,
            search_respects_currency_at_as_of,
            listing_filters_by_status_and_pages,
            erasing_a_scope_counts_and_spares_other_scopes,
            playbook_versions_are_conditional,
            usage_is_counted,
            episodes_are_searchable_by_session,
            episodes_are_found_by_their_neighbours_in_the_session,
            readied_ingests_commit_as_unreadied_ones,
            vector_search_is_scoped_and_current,
            the_embedding_space_is_claimed_once,
            vectors_move_to_another_space_in_one_step,
            vectors_follow_erasure_and_reuse,
            vector_search_follows_every_change_after_first_use,
            the_watermark_moves_only_from_where_it_is,
            derived_writes_need_their_episodes,
            erasure_fences_what_began_before_it,
            imports_claim_the_scope_one_at_a_time,
            forgetting_a_held_fact_takes_its_review,
            a_scopes_runs_are_leased_to_one_holder_at_a_time,
            a_key_is_used_once_until_it_expires,
            shared_limits_are_exact_under_concurrent_takes,
            review_queues_are_counted_per_tenant,
            no_read_crosses_a_scope,
            audit_keys_belong_to_their_scope_and_die_with_it,
            whole_set_reads_are_never_cut_short,
            an_active_value_is_held_once,
            jobs_are_durable_leased_and_scoped,
            tenants_take_turns_and_dead_letters_wait_for_a_retry,
            racing_outcomes_all_count_and_commits_leave_nothing_to_recover,
            text_scores_use_only_the_scopes_statistics,
            users_are_listed_per_tenant,
            search_hits_carry_vectors_when_asked,
            legs_searched_together_answer_as_alone,
            decisions_filter_by_kind_and_page,
            event_time_is_asked_apart_from_belief_time,
            reviews_hold_a_change_until_one_reviewer_decides,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, guard) = $make;
                let store: std::sync::Arc<dyn cairn_core::MemoryStore> = std::sync::Arc::new(store);
                $crate::$name(store).await;
                drop(guard);
            }
        )*
    };
}

/// Every word of the project's own prose (README, ARCHITECTURE and the book) and
/// evaluation scenarios, plus the classic examples of each Porter rule, lower-cased and
/// sorted: the vocabulary on which each backend's index must stem words as scoring does
/// (`cairn_core::porter`).
pub fn vocabulary() -> Vec<String> {
    let corpus = [
        include_str!("../../../README.md"),
        include_str!("../../../ARCHITECTURE.md"),
        include_str!("../../../docs/src/concepts/consolidation.md"),
        include_str!("../../../docs/src/concepts/memory-model.md"),
        include_str!("../../../docs/src/evaluation/embedding-models.md"),
        include_str!("../../../docs/src/evaluation/index.md"),
        include_str!("../../../docs/src/getting-started.md"),
        include_str!("../../../docs/src/guides/clients.md"),
        include_str!("../../../docs/src/guides/console.md"),
        include_str!("../../../docs/src/guides/frameworks.md"),
        include_str!("../../../docs/src/guides/mcp.md"),
        include_str!("../../../docs/src/guides/review.md"),
        include_str!("../../../docs/src/introduction.md"),
        include_str!("../../../docs/src/operators/backup.md"),
        include_str!("../../../docs/src/operators/export-import.md"),
        include_str!("../../../docs/src/operators/helm.md"),
        include_str!("../../../docs/src/operators/image.md"),
        include_str!("../../../docs/src/operators/local-models.md"),
        include_str!("../../../docs/src/operators/observability.md"),
        include_str!("../../../docs/src/operators/replicas.md"),
        include_str!("../../../docs/src/operators/search-cluster.md"),
        include_str!("../../../docs/src/reference/cli.md"),
        include_str!("../../../docs/src/reference/configuration.md"),
        include_str!("../../../docs/src/reference/errors.md"),
        include_str!("../../../docs/src/reference/mcp-tools.md"),
        include_str!("../../../docs/src/reference/logs.md"),
        include_str!("../../../docs/src/reference/metrics.md"),
        include_str!("../../../docs/src/reference/rest.md"),
        include_str!("../../../docs/src/results/benchmarks.md"),
        include_str!("../../../docs/src/results/history.md"),
        include_str!("../../../evals/scenarios/scenarios.json"),
        include_str!("../../../evals/scenarios/holdout.json"),
        "possibility generalizations relational conditional archaeology hopefulness \
         sensitivity conformably agreed feed plastered motoring conflated troubled sized \
         hopping falling filing happy skies dying lying news electrical adjustment \
         controlling vietnamization predication operator feudalism decisiveness \
         formality sensibility triplicate formative formalize electricity hopeful \
         goodness revival allowance inference airliner gyroscopic adjustable defensible \
         irritant replacement dependent adoption homologous communism activate \
         angularity effective bowdlerize probate rate cease controll roll",
    ];
    let words: std::collections::BTreeSet<String> = corpus
        .iter()
        .flat_map(|text| text.split(|c: char| !c.is_ascii_alphabetic()))
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.into_iter().collect()
}

/// A scope as the authentication layer would produce it.
#[allow(clippy::disallowed_methods)]
pub fn scope(tenant: &str, user: &str) -> Scope {
    let tenant = TenantId::parse(tenant).expect("valid tenant");
    Principal::from_verified_credential("conformance".into(), tenant, None, vec![Permission::Admin])
        .scope_for(user, Permission::Admin)
        .expect("valid scope")
}

/// A whole tenant as an admin credential not bound to a user would get it.
#[allow(clippy::disallowed_methods)]
pub fn tenant_scope(tenant: &str) -> cairn_core::TenantScope {
    let tenant = TenantId::parse(tenant).expect("valid tenant");
    Principal::from_verified_credential("conformance".into(), tenant, None, vec![Permission::Admin])
        .tenant_scope()
        .expect("tenant scope")
}

/// An audit event of `scope`, as a change set needs one.
pub fn audit(scope: &Scope, action: &str) -> AuditEvent {
    AuditEvent {
        id: new_id("aud"),
        at: Utc::now(),
        subject: scope.subject().to_owned(),
        tenant: scope.tenant().as_str().to_owned(),
        user: scope.user().as_str().to_owned(),
        action: action.to_owned(),
        target_ids: Vec::new(),
        request_id: "req_conformance".into(),
        detail: serde_json::Value::Null,
    }
}

/// The ten best current records of a tier now, without vectors.
pub fn current_in(tier: Tier) -> SearchFilter {
    SearchFilter {
        tier,
        as_of: Utc::now(),
        include_history: false,
        include_pending: false,
        valid_at: None,
        fact_types: Vec::new(),
        session_id: None,
        limit: 10,
        with_vectors: false,
    }
}

/// An episode of session `s1`, said now, not yet embedded.
pub fn session_episode(text: &str) -> Episode {
    let now = Utc::now();
    Episode {
        id: new_id("epi"),
        session_id: Some("s1".into()),
        text: text.into(),
        occurred_at: now,
        ingested_at: now,
        embedding: None,
    }
}

pub fn fact(text: &str, created_at: DateTime<Utc>) -> Fact {
    Fact {
        source_episode_ids: vec!["epi_1".into()],
        embedding: Some(vec![0.25, -0.5, 1.0]),
        ..Fact::new_active(
            new_id("fact"),
            FactType::Preference,
            text.to_owned(),
            0.9,
            created_at,
        )
    }
}

/// The change set of an ingest of `episodes`, audited.
pub fn ingest(scope: &Scope, episodes: Vec<Episode>) -> ChangeSet {
    ChangeSet::new(audit(scope, "episode.ingest")).with(Change::InsertEpisodes(episodes))
}

async fn ingest_episodes(store: &dyn MemoryStore, scope: &Scope, episodes: Vec<cairn_core::Episode>) {
    store
        .commit(scope, ingest(scope, episodes))
        .await
        .expect("ingest episodes");
    store.make_ingests_searchable().await.expect("searchable");
}

/// Forgets a fact of the scope (`Change::EraseFact`), which must succeed.
async fn erase_fact(store: &dyn MemoryStore, scope: &Scope, fact_id: &str) {
    store
        .commit(
            scope,
            ChangeSet::new(audit(scope, "fact.forget")).with(Change::EraseFact {
                fact_id: fact_id.to_owned(),
            }),
        )
        .await
        .expect("erase the fact");
}

async fn insert(store: &dyn MemoryStore, scope: &Scope, fact: &Fact) {
    store
        .commit(
            scope,
            ChangeSet::new(audit(scope, "fact.create")).with(Change::InsertFact(fact.clone())),
        )
        .await
        .expect("insert fact");
}

async fn create_playbook(store: &dyn MemoryStore, scope: &Scope, playbook: &Playbook) {
    store
        .commit(
            scope,
            ChangeSet::new(audit(scope, "playbook.create")).with(Change::InsertPlaybook(playbook.clone())),
        )
        .await
        .expect("create playbook");
}

async fn search(
    store: &dyn MemoryStore,
    scope: &Scope,
    text: &str,
    as_of: DateTime<Utc>,
    history: bool,
) -> Vec<String> {
    store
        .search_text(
            scope,
            &TextQuery::new(
                SearchFilter {
                    as_of,
                    include_history: history,
                    limit: 50,
                    with_vectors: true,
                    ..current_in(Tier::Semantic)
                },
                text.to_owned(),
            ),
        )
        .await
        .expect("search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect()
}

fn supersede(scope: &Scope, old: &Fact, new: &Fact) -> ChangeSet {
    ChangeSet::new(audit(scope, "fact.supersede"))
        .with(Change::SupersedeFact {
            fact_id: old.id.clone(),
            superseded_by: new.id.clone(),
            at: new.created_at,
            valid_to: new.valid_from,
        })
        .with(Change::InsertEdge(Edge {
            from_fact_id: new.id.clone(),
            to_fact_id: old.id.clone(),
            kind: EdgeKind::Updates,
            created_at: new.created_at,
        }))
        .with(Change::InsertFact(new.clone()))
}

pub async fn facts_are_visible_only_in_their_scope(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let other_tenant_alice = scope("globex", "alice");
    let record = fact("Alice prefers green tea", Utc::now());
    insert(store.as_ref(), &alice, &record).await;
    let found = store
        .get_fact(&alice, &record.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(found.text, record.text);
    assert_eq!(found.embedding, record.embedding);
    assert_eq!(found.source_episode_ids, record.source_episode_ids);
    assert!(store.get_fact(&bob, &record.id).await.expect("get").is_none());
    assert!(
        store
            .get_fact(&other_tenant_alice, &record.id)
            .await
            .expect("get")
            .is_none()
    );
    let listed = store
        .list_facts(
            &other_tenant_alice,
            StatusFilter::All,
            Utc::now(),
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("list");
    assert!(listed.items.is_empty());
    let audit_of_other = store
        .list_audit(
            &other_tenant_alice,
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("audit");
    assert!(audit_of_other.items.is_empty());
    let own_audit = store
        .list_audit(
            &alice,
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("audit");
    assert_eq!(own_audit.items.len(), 1);
    assert_eq!(own_audit.items[0].tenant, "acme");
}

pub async fn search_is_restricted_to_the_scope(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let mallory = scope("evil", "alice");
    let now = Utc::now();
    insert(
        store.as_ref(),
        &alice,
        &fact("The user owns a sailboat named Aurora", now),
    )
    .await;
    insert(
        store.as_ref(),
        &mallory,
        &fact("The user owns a sailboat named Borealis", now),
    )
    .await;
    let hits = search(store.as_ref(), &alice, "sailboat", now, false).await;
    assert_eq!(hits.len(), 1);
    let mallory_hits = search(store.as_ref(), &mallory, "aurora", now, false).await;
    assert!(
        mallory_hits.is_empty(),
        "a term present only in another scope must not match"
    );
    // Query syntax in the text is treated as plain words.
    let odd = search(
        store.as_ref(),
        &alice,
        "sailboat\" OR scope_key : * NEAR(",
        now,
        false,
    )
    .await;
    assert_eq!(odd.len(), 1);
    assert!(search(store.as_ref(), &alice, "!!!", now, false).await.is_empty());
}

pub async fn supersession_is_owner_checked_and_atomic(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let intruder = scope("globex", "alice");
    let now = Utc::now();
    let first = fact("The user lives in Paris", now);
    insert(store.as_ref(), &alice, &first).await;
    let hijack = fact("The user lives in Moscow", now);
    let refused = store
        .commit(&intruder, supersede(&intruder, &first, &hijack))
        .await;
    assert!(matches!(refused, Err(Error::NotFound { .. })), "{refused:?}");
    assert!(
        store
            .get_fact(&intruder, &hijack.id)
            .await
            .expect("get")
            .is_none(),
        "nothing written"
    );
    let current = store
        .get_fact(&alice, &first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(current.status, FactStatus::Active);

    let second = fact("The user lives in Lyon", now + Duration::seconds(1));
    store
        .commit(&alice, supersede(&alice, &first, &second))
        .await
        .expect("supersede");
    let old = store
        .get_fact(&alice, &first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(old.status, FactStatus::Superseded);
    assert_eq!(old.superseded_by.as_deref(), Some(second.id.as_str()));
    let replaced = store
        .list_superseded_by(&alice, &second.id)
        .await
        .expect("predecessors");
    assert_eq!(
        replaced.iter().map(|fact| fact.id.as_str()).collect::<Vec<_>>(),
        [first.id.as_str()]
    );
    assert!(
        store
            .list_superseded_by(&intruder, &second.id)
            .await
            .expect("predecessors")
            .is_empty(),
        "another scope sees no history"
    );
    assert!(
        store
            .list_superseded_by(&alice, &first.id)
            .await
            .expect("predecessors")
            .is_empty()
    );

    let third = fact("The user lives in Nice", now + Duration::seconds(2));
    let stale = store.commit(&alice, supersede(&alice, &first, &third)).await;
    assert!(
        matches!(
            stale,
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::NotActive,
                ..
            })
        ),
        "{stale:?}"
    );
    assert!(
        store.get_fact(&alice, &third.id).await.expect("get").is_none(),
        "rolled back"
    );
}

pub async fn concurrent_supersessions_let_exactly_one_win(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let original = fact("The user drives a blue car", now);
    insert(store.as_ref(), &alice, &original).await;
    let mut tasks = Vec::new();
    for colour in ["red", "green", "white", "black"] {
        let store = Arc::clone(&store);
        let alice = alice.clone();
        let original = original.clone();
        tasks.push(tokio::spawn(async move {
            let replacement = fact(&format!("The user drives a {colour} car"), Utc::now());
            store
                .commit(&alice, supersede(&alice, &original, &replacement))
                .await
        }));
    }
    let mut wins = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => wins += 1,
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::NotActive,
                ..
            }) => {}
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert_eq!(wins, 1);
    let active = store
        .list_facts(
            &alice,
            StatusFilter::Only(FactStatus::Active),
            Utc::now(),
            &PageRequest {
                limit: 50,
                cursor: None,
            },
        )
        .await
        .expect("list");
    assert_eq!(active.items.len(), 1, "exactly one replacement is current");
}

pub async fn tombstones_block_reinsertion_until_lifted(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let record = fact("The user is allergic to peanuts", now);
    insert(store.as_ref(), &alice, &record).await;
    let tombstone = Tombstone {
        id: new_id("tomb"),
        fingerprint: fingerprint(&record.text),
        fact_id: record.id.clone(),
        reason: TombstoneReason::Retracted,
        created_at: now,
        lifted_at: None,
    };
    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.retract"))
                .with(Change::RetractFact {
                    fact_id: record.id.clone(),
                    reason: Some("never true".into()),
                    at: now,
                })
                .with(Change::InsertTombstone(tombstone.clone())),
        )
        .await
        .expect("retract");
    let retracted = store
        .get_fact(&alice, &record.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(retracted.status, FactStatus::Retracted);
    assert!(
        search(store.as_ref(), &alice, "peanuts", Utc::now(), true)
            .await
            .is_empty()
    );

    let again = fact("the user is ALLERGIC to peanuts!", Utc::now());
    let blocked = store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.create")).with(Change::InsertFact(again.clone())),
        )
        .await;
    assert!(matches!(blocked, Err(Error::Tombstoned { .. })), "{blocked:?}");
    let found = store
        .find_tombstone(&alice, &fingerprint(&again.text))
        .await
        .expect("find");
    assert_eq!(found.map(|t| t.id), Some(tombstone.id.clone()));
    assert!(
        store
            .find_tombstone(&bob, &fingerprint(&again.text))
            .await
            .expect("find")
            .is_none()
    );
    // Another scope is unaffected by this scope's tombstone.
    insert(
        store.as_ref(),
        &bob,
        &fact("The user is allergic to peanuts", Utc::now()),
    )
    .await;

    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.reassert"))
                .with(Change::LiftTombstone {
                    tombstone_id: tombstone.id.clone(),
                    at: Utc::now(),
                })
                .with(Change::InsertFact(again.clone())),
        )
        .await
        .expect("reassert after lifting");
    assert!(
        store
            .find_tombstone(&alice, &fingerprint(&again.text))
            .await
            .expect("find")
            .is_none()
    );
}

pub async fn erased_facts_leave_no_trace_in_reads_or_search(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let old = fact("The user works at Initech", now);
    let new = fact("The user works at Globex", now + Duration::seconds(1));
    insert(store.as_ref(), &alice, &old).await;
    store
        .commit(&alice, supersede(&alice, &old, &new))
        .await
        .expect("supersede");
    let refused = store
        .commit(
            &scope("other", "alice"),
            ChangeSet::new(audit(&alice, "fact.forget")).with(Change::EraseFact {
                fact_id: new.id.clone(),
            }),
        )
        .await;
    assert!(matches!(refused, Err(Error::NotFound { .. })));
    erase_fact(store.as_ref(), &alice, &new.id).await;
    assert!(store.get_fact(&alice, &new.id).await.expect("get").is_none());
    assert!(
        search(store.as_ref(), &alice, "globex", Utc::now(), true)
            .await
            .is_empty()
    );
    let old = store.get_fact(&alice, &old.id).await.expect("get").expect("kept");
    assert_eq!(old.superseded_by, None, "links to an erased fact are dropped");
}

pub async fn search_respects_currency_at_as_of(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let start = Utc::now() - Duration::hours(10);
    let paris = fact("The user lives in Paris near the river", start);
    insert(store.as_ref(), &alice, &paris).await;
    let lyon = fact(
        "The user lives in Lyon near the river",
        start + Duration::hours(5),
    );
    store
        .commit(&alice, supersede(&alice, &paris, &lyon))
        .await
        .expect("supersede");
    let mut exam = fact("The user has a river biology exam", start);
    exam.expires_at = Some(start + Duration::hours(2));
    insert(store.as_ref(), &alice, &exam).await;
    let mut lease = fact("The user rents a river cabin", start);
    lease.valid_from = Some(start + Duration::hours(1));
    lease.valid_to = Some(start + Duration::hours(3));
    insert(store.as_ref(), &alice, &lease).await;

    let now_hits = search(store.as_ref(), &alice, "river", Utc::now(), false).await;
    assert_eq!(
        now_hits,
        vec![lyon.id.clone()],
        "superseded, expired and out-of-validity facts are not current"
    );
    let with_history = search(store.as_ref(), &alice, "river", Utc::now(), true).await;
    assert!(with_history.contains(&paris.id) && with_history.contains(&lyon.id));
    assert!(!with_history.contains(&exam.id));

    let earlier = search(
        store.as_ref(),
        &alice,
        "river",
        start + Duration::minutes(90),
        false,
    )
    .await;
    assert!(
        earlier.contains(&paris.id),
        "before its supersession Paris was current"
    );
    assert!(!earlier.contains(&lyon.id), "Lyon was not known yet");
    assert!(earlier.contains(&exam.id) && earlier.contains(&lease.id));
    assert!(
        search(store.as_ref(), &alice, "river", start - Duration::hours(1), false)
            .await
            .is_empty()
    );
}

pub async fn listing_filters_by_status_and_pages(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let mut ids = Vec::new();
    for index in 0..5 {
        let record = fact(&format!("Fact number {index}"), now);
        insert(store.as_ref(), &alice, &record).await;
        ids.push(record.id);
    }
    let mut expiring = fact("The user is travelling this week", now - Duration::days(8));
    expiring.expires_at = Some(now - Duration::days(1));
    insert(store.as_ref(), &alice, &expiring).await;
    let page = |cursor| PageRequest { limit: 2, cursor };
    let active = StatusFilter::Only(FactStatus::Active);
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let batch = store
            .list_facts(&alice, active, now, &page(cursor))
            .await
            .expect("page");
        assert!(batch.items.len() <= 2);
        seen.extend(batch.items.iter().map(|f| f.id.clone()));
        match batch.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest first, every active fact once");
    let expired = store
        .list_facts(
            &alice,
            StatusFilter::Only(FactStatus::Expired),
            now,
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("expired");
    assert_eq!(
        expired.items.iter().map(|f| f.id.clone()).collect::<Vec<_>>(),
        vec![expiring.id.clone()]
    );
    let bad = store
        .list_facts(
            &alice,
            active,
            now,
            &PageRequest {
                limit: 2,
                cursor: Some("not-a-cursor".into()),
            },
        )
        .await;
    assert!(matches!(bad, Err(Error::Invalid { .. })));
}

pub async fn erasing_a_scope_counts_and_spares_other_scopes(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let episodes = (0..3)
        .map(|index| cairn_core::Episode {
            id: new_id("epi"),
            session_id: Some("s1".into()),
            text: format!("message {index} about gardening"),
            occurred_at: now,
            ingested_at: now,
            embedding: None,
        })
        .collect::<Vec<_>>();
    ingest_episodes(store.as_ref(), &alice, episodes).await;
    let first = fact("The user grows tomatoes", now);
    insert(store.as_ref(), &alice, &first).await;
    let second = fact("The user grows peppers", now);
    store
        .commit(&alice, supersede(&alice, &first, &second))
        .await
        .expect("supersede");
    create_playbook(store.as_ref(), &alice, &playbook(now)).await;
    insert(store.as_ref(), &bob, &fact("The user grows tomatoes", now)).await;

    let receipt = store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    assert_eq!(receipt.episodes, 3);
    assert_eq!(receipt.facts, 2);
    assert_eq!(receipt.playbooks, 1);
    assert_eq!(receipt.playbook_versions, 1);
    assert_eq!(receipt.edges, 1);
    assert!(
        search(store.as_ref(), &alice, "tomatoes", Utc::now(), true)
            .await
            .is_empty()
    );
    assert_eq!(
        search(store.as_ref(), &bob, "tomatoes", Utc::now(), true)
            .await
            .len(),
        1
    );
    let trail = store
        .list_audit(
            &alice,
            &PageRequest {
                limit: 50,
                cursor: None,
            },
        )
        .await
        .expect("audit");
    assert_eq!(trail.items.first().map(|e| e.action.as_str()), Some("user.erase"));
}

fn playbook(at: DateTime<Utc>) -> Playbook {
    Playbook {
        id: new_id("pb"),
        name: "Deploy".into(),
        trigger: "the user asks to ship a release".into(),
        steps: vec!["run the tests".into(), "tag the release".into()],
        version: 1,
        success_count: 0,
        failure_count: 0,
        created_at: at,
        updated_at: at,
        last_used_at: None,
        use_count: 0,
        embedding: None,
    }
}

pub async fn playbook_versions_are_conditional(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let first = playbook(now);
    create_playbook(store.as_ref(), &alice, &first).await;
    let mut second = first.clone();
    second.version = 2;
    second.steps.push("announce it".into());
    let append = |expected_version, playbook: &Playbook| {
        ChangeSet::new(audit(&alice, "playbook.version")).with(Change::AppendPlaybookVersion {
            expected_version,
            playbook: playbook.clone(),
        })
    };
    store.commit(&alice, append(1, &second)).await.expect("version 2");
    let stale = store.commit(&alice, append(1, &second)).await;
    assert!(
        matches!(
            stale,
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::VersionConflict,
                ..
            })
        ),
        "{stale:?}"
    );
    let foreign = store.commit(&scope("globex", "alice"), append(2, &second)).await;
    assert!(matches!(foreign, Err(Error::NotFound { .. })));
    for success in [true, true, false] {
        store
            .commit(
                &alice,
                ChangeSet::new(audit(&alice, "playbook.outcome")).with(Change::RecordPlaybookOutcome {
                    playbook_id: first.id.clone(),
                    success,
                    at: now,
                }),
            )
            .await
            .expect("outcome");
    }
    let current = store
        .get_playbook(&alice, &first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        (current.version, current.success_count, current.failure_count),
        (2, 2, 1)
    );
    assert_eq!(current.steps.len(), 3);
    let versions = store
        .playbook_versions(&alice, &first.id)
        .await
        .expect("versions");
    assert_eq!(
        versions.iter().map(|v| v.steps.len()).collect::<Vec<_>>(),
        vec![2, 3]
    );
    let hits = store
        .search_text(
            &alice,
            &TextQuery::new(
                SearchFilter {
                    limit: 5,
                    with_vectors: true,
                    ..current_in(Tier::Procedural)
                },
                "announce release",
            ),
        )
        .await
        .expect("search");
    assert!(matches!(hits.first().map(|h| &h.memory), Some(Memory::Playbook(p)) if p.version == 2));
}

/// Outcomes recorded concurrently on one playbook all count (a counter is never a lost
/// update), and commits that ran to the end leave nothing for recovery.
pub async fn racing_outcomes_all_count_and_commits_leave_nothing_to_recover(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let book = playbook(now);
    create_playbook(store.as_ref(), &alice, &book).await;
    let mut racing = Vec::new();
    for round in 0..8 {
        let (store, alice, id) = (Arc::clone(&store), alice.clone(), book.id.clone());
        racing.push(tokio::spawn(async move {
            store
                .commit(
                    &alice,
                    ChangeSet::new(audit(&alice, "playbook.outcome")).with(Change::RecordPlaybookOutcome {
                        playbook_id: id,
                        success: round % 4 != 0,
                        at: Utc::now(),
                    }),
                )
                .await
        }));
    }
    for outcome in racing {
        outcome.await.expect("task").expect("outcome");
    }
    let counted = store
        .get_playbook(&alice, &book.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!((counted.success_count, counted.failure_count), (6, 2));

    let first = fact("The user lives in Paris", now);
    insert(store.as_ref(), &alice, &first).await;
    let second = fact("The user lives in Lyon", now + Duration::seconds(1));
    store
        .commit(&alice, supersede(&alice, &first, &second))
        .await
        .expect("supersede");
    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.retract")).with(Change::RetractFact {
                fact_id: second.id.clone(),
                reason: None,
                at: now + Duration::seconds(2),
            }),
        )
        .await
        .expect("retract");
    let left = store
        .recover_commits(std::time::Duration::ZERO)
        .await
        .expect("recover");
    assert_eq!(left, 0, "finished commits leave no journal");
    let old = store
        .get_fact(&alice, &first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(old.status, FactStatus::Superseded, "recovery changed nothing");
}

pub async fn usage_is_counted(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let mut record = fact("The user likes jazz", Utc::now());
    record.embedding = Some(unit(&[0.6, 0.8, 0.0]));
    insert(store.as_ref(), &alice, &record).await;
    let later = Utc::now();
    let uses = |count, last_used_at| {
        vec![
            UseCount {
                id: record.id.clone(),
                count,
                last_used_at,
            },
            UseCount {
                id: "fact_never_written".into(),
                count,
                last_used_at,
            },
        ]
    };
    store.record_usage(&alice, &uses(1, later)).await.expect("usage");
    // A batch counted earlier but flushed later adds its count, and the time stays.
    store
        .record_usage(&alice, &uses(3, later - Duration::minutes(5)))
        .await
        .expect("usage");
    store
        .record_usage(&scope("globex", "alice"), &uses(7, later))
        .await
        .expect("no-op elsewhere");
    let used = store
        .get_fact(&alice, &record.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(used.use_count, 4);
    assert_eq!(
        used.last_used_at.map(|at| at.timestamp_micros()),
        Some(later.timestamp_micros())
    );
    // Listings and search hits (with the counts a store keeps apart applied) agree.
    let listed = store
        .list_facts(
            &alice,
            StatusFilter::All,
            Utc::now(),
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("list");
    assert_eq!(
        listed.items.iter().map(|fact| fact.use_count).collect::<Vec<_>>(),
        vec![4]
    );
    let filter = current_in(Tier::Semantic);
    // Recall's counts may lag by a cluster's refresh interval (1 s).
    let started = std::time::Instant::now();
    loop {
        let mut found: Vec<Memory> = store
            .search_text(&alice, &TextQuery::new(filter.clone(), "jazz"))
            .await
            .expect("search")
            .into_iter()
            .map(|hit| hit.memory)
            .collect();
        let mut counted: Vec<&mut Memory> = found.iter_mut().collect();
        store.apply_usage(&alice, &mut counted).await.expect("counts");
        if matches!(found.as_slice(), [Memory::Fact(fact)] if fact.use_count == 4) {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "{found:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Counting keeps the record's vector, readable and found.
    assert_eq!(used.embedding, record.embedding);
    let query = unit(&[0.6, 0.8, 0.0]);
    assert_eq!(
        nearest_in(store.as_ref(), &alice, Tier::Semantic, &query, false).await,
        vec![record.id.clone()]
    );
}

pub async fn episodes_are_searchable_by_session(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let now = Utc::now();
    let make = |session: &str, text: &str| cairn_core::Episode {
        id: new_id("epi"),
        session_id: Some(session.to_owned()),
        text: text.to_owned(),
        occurred_at: now - Duration::days(3),
        ingested_at: now,
        embedding: None,
    };
    let first = make("s1", "I adopted a puppy called Biscuit");
    let second = make("s2", "Biscuit chewed my shoes");
    ingest_episodes(store.as_ref(), &alice, vec![first.clone(), second.clone()]).await;
    let query = |session: Option<&str>| {
        TextQuery::new(
            SearchFilter {
                session_id: session.map(str::to_owned),
                with_vectors: true,
                ..current_in(Tier::Episodic)
            },
            "biscuit",
        )
    };
    assert_eq!(
        store
            .search_text(&alice, &query(None))
            .await
            .expect("search")
            .len(),
        2
    );
    let only_s2 = store
        .search_text(&alice, &query(Some("s2")))
        .await
        .expect("search");
    assert_eq!(
        only_s2
            .iter()
            .map(|h| h.memory.id().to_owned())
            .collect::<Vec<_>>(),
        vec![second.id.clone()]
    );
    let page = PageRequest {
        limit: 10,
        cursor: None,
    };
    let listed = |session: Option<&'static str>, who: Scope| {
        let store = Arc::clone(&store);
        let page = page.clone();
        async move {
            store
                .list_episodes(&who, session, &page)
                .await
                .expect("list")
                .items
                .into_iter()
                .map(|episode| episode.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(Some("s1"), alice.clone()).await, vec![first.id.clone()]);
    assert_eq!(listed(None, alice.clone()).await.len(), 2);
    assert!(listed(Some("nope"), alice.clone()).await.is_empty());
    assert!(listed(Some("s1"), scope("acme", "bob")).await.is_empty());
    let stored = store
        .get_episode(&alice, &first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        stored.occurred_at.timestamp_micros(),
        first.occurred_at.timestamp_micros()
    );
    assert!(
        store
            .get_episode(&scope("acme", "bob"), &first.id)
            .await
            .expect("get")
            .is_none()
    );
}

/// An episode is indexed with the episodes before and after it in its session as
/// context: a reply is found by the words of what it answers (and a statement by the
/// reply's), below an episode that says them itself, across commits; context never
/// crosses sessions or scopes, and episodes without a session have none.
pub async fn episodes_are_found_by_their_neighbours_in_the_session(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let make = |session: Option<&str>, text: &str| cairn_core::Episode {
        id: new_id("epi"),
        session_id: session.map(str::to_owned),
        text: text.to_owned(),
        occurred_at: now,
        ingested_at: now,
        embedding: None,
    };
    let ingest = |scope: Scope, episodes: Vec<cairn_core::Episode>| {
        let store = Arc::clone(&store);
        async move { ingest_episodes(store.as_ref(), &scope, episodes).await }
    };
    let question = make(Some("s1"), "Which marathon are you training for?");
    let reply = make(Some("s1"), "The one in Lisbon, in October.");
    let elsewhere = make(Some("s2"), "I bought new running shoes.");
    let no_session = make(None, "Nothing planned yet.");
    ingest(alice.clone(), vec![question.clone(), reply.clone()]).await;
    // A later commit: its first episode's context is the last stored one of its session.
    let later = make(Some("s1"), "Yes, with my sister.");
    ingest(
        alice.clone(),
        vec![elsewhere.clone(), later.clone(), no_session.clone()],
    )
    .await;
    ingest(
        bob.clone(),
        vec![make(Some("s1"), "Marathon training starts Monday")],
    )
    .await;
    let found_weighted = |scope: Scope, text: &'static str, context_weight: f64| {
        let store = Arc::clone(&store);
        async move {
            let query = TextQuery {
                context_weight,
                ..TextQuery::new(
                    SearchFilter {
                        with_vectors: true,
                        ..current_in(Tier::Episodic)
                    },
                    text,
                )
            };
            store
                .search_text(&scope, &query)
                .await
                .expect("search")
                .into_iter()
                .map(|hit| hit.memory.id().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let found = |scope: Scope, text: &'static str| found_weighted(scope, text, TextQuery::CONTEXT_WEIGHT);
    assert_eq!(
        found(alice.clone(), "marathon training").await,
        vec![question.id.clone(), reply.id.clone()],
        "the question first, then the reply through its context"
    );
    let lisbon = found(alice.clone(), "Lisbon").await;
    assert_eq!(lisbon.first(), Some(&reply.id), "its own text first: {lisbon:?}");
    let mut through_context = lisbon[1..].to_vec();
    through_context.sort();
    let mut neighbours = vec![question.id.clone(), later.id.clone()];
    neighbours.sort();
    assert_eq!(through_context, neighbours, "the episodes before and after it");
    assert_eq!(
        found(alice.clone(), "running shoes").await,
        vec![elsewhere.id.clone()]
    );
    assert_eq!(
        found(alice.clone(), "sister").await,
        vec![later.id.clone(), reply.id.clone()],
        "a stored episode gets the next one of a later commit as context"
    );
    assert_eq!(
        found_weighted(alice.clone(), "Lisbon", 0.0).await,
        vec![reply.id.clone()],
        "a context weight of 0 searches the text alone"
    );
    let stored = store
        .get_episode(&alice, &reply.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        stored.text, reply.text,
        "context is indexed, not stored in the text"
    );
}

/// An ingest readied while its episodes are embedded (`prepare_episodes`) commits what
/// one not readied does, in its own scope only: the log in ingest order, and a stored
/// episode given the next one of its session as context. Readying for one scope does
/// not place episodes that another scope commits.
pub async fn readied_ingests_commit_as_unreadied_ones(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let texts = [
        "I train for the Lisbon marathon",
        "My sister runs it with me",
        "We fly on Friday",
    ];
    let mut written = Vec::new();
    for (index, text) in texts.iter().enumerate() {
        let said = session_episode(text);
        store
            .prepare_episodes(&alice, std::slice::from_ref(&said))
            .await
            .expect("ready");
        // The middle one is readied in alice's scope and committed in bob's.
        let owner = if index == 1 { &bob } else { &alice };
        ingest_episodes(store.as_ref(), owner, vec![said.clone()]).await;
        if index != 1 {
            written.push(said);
        }
    }
    let alices: Vec<String> = store
        .episodes_up_to(&alice, 1_000, 10)
        .await
        .expect("log")
        .into_iter()
        .map(|logged| logged.episode.text)
        .collect();
    assert_eq!(
        alices,
        [texts[0], texts[2]],
        "alice's log holds alice's commits, in order"
    );
    let bobs = store.episodes_up_to(&bob, 1_000, 10).await.expect("log");
    assert_eq!(bobs.len(), 1, "bob's commit is in bob's log");
    assert_eq!(bobs[0].episode.text, texts[1]);
    let found: Vec<String> = store
        .search_text(&alice, &TextQuery::new(current_in(Tier::Episodic), "Friday"))
        .await
        .expect("search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect();
    assert_eq!(
        found,
        [written[1].id.clone(), written[0].id.clone()],
        "the readied commit gave the stored episode before it its text as context"
    );
}

fn unit(values: &[f32]) -> Vec<f32> {
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    values.iter().map(|v| v / norm).collect()
}

async fn nearest(
    store: &dyn MemoryStore,
    scope: &Scope,
    vector: &[f32],
    history: bool,
) -> Vec<(String, f64)> {
    store
        .search_vector(
            scope,
            &VectorQuery {
                vector: vector.to_vec(),
                filter: SearchFilter {
                    include_history: history,
                    with_vectors: true,
                    ..current_in(Tier::Semantic)
                },
            },
        )
        .await
        .expect("vector search")
        .into_iter()
        .map(|hit| (hit.memory.id().to_owned(), hit.score))
        .collect()
}

pub async fn vector_search_is_scoped_and_current(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let mallory = scope("evil", "alice");
    let now = Utc::now() - Duration::minutes(1);
    let query = unit(&[1.0, 0.0, 0.0]);
    // Another scope holds the exact query vector: it must never be returned here.
    let mut decoy = fact("Mallory's nearest record", now);
    decoy.embedding = Some(query.clone());
    insert(store.as_ref(), &mallory, &decoy).await;
    let mut near = fact("Alice's near record", now);
    near.embedding = Some(unit(&[0.9, 0.1, 0.0]));
    insert(store.as_ref(), &alice, &near).await;
    let mut far = fact("Alice's far record", now);
    far.embedding = Some(unit(&[0.0, 0.2, 1.0]));
    insert(store.as_ref(), &alice, &far).await;
    let mut old = fact("Alice's superseded record", now);
    old.embedding = Some(unit(&[0.95, 0.05, 0.0]));
    insert(store.as_ref(), &alice, &old).await;
    let mut newer = fact("Alice's replacement record", now + Duration::seconds(1));
    newer.embedding = Some(unit(&[0.3, 1.0, 0.0]));
    store
        .commit(&alice, supersede(&alice, &old, &newer))
        .await
        .expect("supersede");
    let mut expired = fact("Alice's expired record", now - Duration::days(2));
    expired.embedding = Some(query.clone());
    expired.expires_at = Some(now - Duration::days(1));
    insert(store.as_ref(), &alice, &expired).await;

    let hits = nearest(store.as_ref(), &alice, &query, false).await;
    let ids: Vec<&str> = hits.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, vec![near.id.as_str(), newer.id.as_str(), far.id.as_str()]);
    assert!(
        hits[0].1 > 0.99 && hits[0].1 <= 1.0001,
        "cosine similarity {}",
        hits[0].1
    );
    assert!(hits.windows(2).all(|pair| pair[0].1 >= pair[1].1), "best first");
    let with_history = nearest(store.as_ref(), &alice, &query, true).await;
    assert_eq!(
        with_history.first().map(|(id, _)| id.as_str()),
        Some(old.id.as_str())
    );
    let mallory_hits = nearest(store.as_ref(), &mallory, &query, false).await;
    assert_eq!(
        mallory_hits.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        vec![decoy.id.as_str()]
    );
    assert!(
        nearest(store.as_ref(), &scope("acme", "nobody"), &query, true)
            .await
            .is_empty()
    );
}

pub async fn the_embedding_space_is_claimed_once(store: Arc<dyn MemoryStore>) {
    store
        .claim_embedding_space("all-minilm-l6-v2", 384)
        .await
        .expect("first claim");
    store
        .claim_embedding_space("all-minilm-l6-v2", 384)
        .await
        .expect("same claim");
    let other = store.claim_embedding_space("bge-base", 768).await;
    assert!(
        matches!(other, Err(Error::Unavailable(ref message)) if message.contains("384")),
        "{other:?}"
    );
}

/// `cairn reembed`: vectors of another space are built beside the current ones, which
/// keep serving; erased or changed records lose what was built for them; the switch
/// happens only when nothing is left, and then all at once.
pub async fn vectors_move_to_another_space_in_one_step(store: Arc<dyn MemoryStore>) {
    store.claim_embedding_space("model-a", 3).await.expect("claim");
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let at = Utc::now() - Duration::minutes(1);
    let (east, north) = (unit(&[1.0, 0.0, 0.0]), unit(&[0.0, 1.0, 0.0]));
    let mut kept = fact("The user keeps this one", at);
    kept.embedding = Some(east.clone());
    let mut forgotten = fact("The user forgets this one", at);
    forgotten.embedding = Some(north.clone());
    let mut later = fact("The user says this later", at);
    later.embedding = Some(north.clone());
    insert(store.as_ref(), &alice, &kept).await;
    insert(store.as_ref(), &alice, &forgotten).await;
    insert(store.as_ref(), &bob, &later).await;

    let started = match store.start_reembedding("model-b/3").await {
        Ok(started) => started,
        Err(Error::Unavailable(message)) => {
            // A backend that cannot move its vectors yet says so and changes nothing.
            assert!(message.contains("not supported"), "{message}");
            store
                .claim_embedding_space("model-a", 3)
                .await
                .expect("the claim is unchanged");
            return;
        }
        Err(other) => panic!("start: {other:?}"),
    };
    assert_eq!(
        (started.current.as_deref(), started.built, started.remaining),
        (Some("model-a/3"), 0, 3)
    );
    let first = store.pending_reembedding(2).await.expect("pending");
    assert_eq!(first.len(), 2, "{first:?}");
    let built = |record: &cairn_core::ToReembed, vector: &[f32]| cairn_core::Reembedded {
        tier: record.tier,
        id: record.id.clone(),
        text: record.text.clone(),
        vector: vector.to_vec(),
    };
    // The new space swaps the directions.
    let swapped: Vec<cairn_core::Reembedded> = first
        .iter()
        .map(|record| {
            assert_eq!(record.tier, Tier::Semantic);
            built(record, if record.id == kept.id { &north } else { &east })
        })
        .collect();
    store.store_reembedded(swapped).await.expect("store");
    assert_eq!(
        nearest(store.as_ref(), &alice, &east, false).await[0].0,
        kept.id,
        "the current vectors keep serving while the new ones are built"
    );

    // Forgetting a record drops what was built for it.
    erase_fact(store.as_ref(), &alice, &forgotten.id).await;
    let halfway = store.finish_reembedding().await.expect("finish");
    assert_eq!(
        (halfway.current.as_deref(), halfway.built, halfway.remaining),
        (Some("model-a/3"), 1, 1),
        "no switch while a record is left, and nothing kept of the forgotten one: {halfway:?}"
    );
    let rest = store.pending_reembedding(10).await.expect("pending");
    assert_eq!(
        rest.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(),
        vec![later.id.as_str()],
        "only what is left, and nothing forgotten"
    );
    // A vector built from text the record no longer holds is not kept.
    let mut stale = built(&rest[0], &east);
    stale.text = "The user said something else".into();
    store.store_reembedded(vec![stale]).await.expect("stale");
    assert_eq!(store.finish_reembedding().await.expect("finish").remaining, 1);
    let wrong_length = store.store_reembedded(vec![built(&rest[0], &[1.0, 0.0])]).await;
    assert!(
        matches!(wrong_length, Err(Error::Invalid { .. })),
        "{wrong_length:?}"
    );
    store
        .store_reembedded(vec![built(&rest[0], &east)])
        .await
        .expect("store");

    let done = store.finish_reembedding().await.expect("finish");
    assert_eq!((done.current.as_deref(), done.remaining), (Some("model-b/3"), 0));
    assert_eq!(
        nearest(store.as_ref(), &alice, &north, false).await[0].0,
        kept.id,
        "every vector was replaced at once"
    );
    assert_eq!(nearest(store.as_ref(), &bob, &east, false).await[0].0, later.id);
    let old = store.claim_embedding_space("model-a", 3).await;
    assert!(
        matches!(old, Err(Error::Unavailable(ref message)) if message.contains("cairn reembed")),
        "{old:?}"
    );
    store
        .claim_embedding_space("model-b", 3)
        .await
        .expect("the new space is claimed");
    let again = store.start_reembedding("model-b/3").await.expect("again");
    assert_eq!((again.built, again.remaining), (0, 0), "already there");
}

pub async fn vectors_follow_erasure_and_reuse(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let first_vector = unit(&[1.0, 0.0, 0.0]);
    let mut first = fact(
        "A record that will be forgotten",
        Utc::now() - Duration::minutes(1),
    );
    first.embedding = Some(first_vector.clone());
    insert(store.as_ref(), &alice, &first).await;
    assert_eq!(
        nearest(store.as_ref(), &alice, &first_vector, false).await[0].0,
        first.id
    );
    erase_fact(store.as_ref(), &alice, &first.id).await;
    assert!(
        nearest(store.as_ref(), &alice, &first_vector, false)
            .await
            .is_empty(),
        "erased vectors are gone"
    );
    // A new record may take the erased record's place in storage; it must be scored by its own vector.
    let second_vector = unit(&[0.0, 0.0, 1.0]);
    let mut second = fact("A record written afterwards", Utc::now() - Duration::minutes(1));
    second.embedding = Some(second_vector.clone());
    insert(store.as_ref(), &alice, &second).await;
    let hits = nearest(store.as_ref(), &alice, &second_vector, false).await;
    assert_eq!(hits[0].0, second.id);
    assert!(hits[0].1 > 0.99, "scored with its own vector: {}", hits[0].1);
}

/// Ids of the kNN hits of one tier, best first.
async fn nearest_in(
    store: &dyn MemoryStore,
    scope: &Scope,
    tier: Tier,
    vector: &[f32],
    history: bool,
) -> Vec<String> {
    let filter = SearchFilter {
        include_history: history,
        with_vectors: true,
        ..current_in(tier)
    };
    store
        .search_vector(
            scope,
            &VectorQuery {
                vector: vector.to_vec(),
                filter,
            },
        )
        .await
        .expect("vector search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect()
}

/// Once a scope has been searched (so a backend may hold an index of it), every later
/// change shows in the next search: inserts, supersession, retraction, new episodes and
/// new playbook versions.
pub async fn vector_search_follows_every_change_after_first_use(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let at = Utc::now() - Duration::minutes(1);
    let query = unit(&[1.0, 0.0, 0.0]);
    let mut first = fact("The first record", at);
    first.embedding = Some(unit(&[0.8, 0.6, 0.0]));
    insert(store.as_ref(), &alice, &first).await;
    let semantic = |history| nearest_in(store.as_ref(), &alice, Tier::Semantic, &query, history);
    assert_eq!(semantic(false).await, vec![first.id.clone()]);

    let mut closer = fact("A closer record", at);
    closer.embedding = Some(unit(&[0.95, 0.05, 0.0]));
    insert(store.as_ref(), &alice, &closer).await;
    assert_eq!(semantic(false).await, vec![closer.id.clone(), first.id.clone()]);

    let mut replacement = fact("The closer record's replacement", at + Duration::seconds(1));
    replacement.embedding = Some(unit(&[0.0, 0.0, 1.0]));
    store
        .commit(&alice, supersede(&alice, &closer, &replacement))
        .await
        .expect("supersede");
    assert_eq!(
        semantic(false).await,
        vec![first.id.clone(), replacement.id.clone()]
    );
    assert_eq!(semantic(true).await.first(), Some(&closer.id), "history keeps it");

    let retract = ChangeSet::new(audit(&alice, "fact.retract")).with(Change::RetractFact {
        fact_id: first.id.clone(),
        reason: None,
        at: Utc::now(),
    });
    store.commit(&alice, retract).await.expect("retract");
    assert!(
        !semantic(true).await.contains(&first.id),
        "retracted: never found"
    );

    let mut said = episode("An episode said later", at);
    said.embedding = Some(query.clone());
    assert!(
        nearest_in(store.as_ref(), &alice, Tier::Episodic, &query, false)
            .await
            .is_empty()
    );
    ingest_episodes(store.as_ref(), &alice, vec![said.clone()]).await;
    assert_eq!(
        nearest_in(store.as_ref(), &alice, Tier::Episodic, &query, false).await,
        vec![said.id.clone()]
    );

    let mut procedure = playbook(at);
    procedure.embedding = Some(query.clone());
    let create =
        ChangeSet::new(audit(&alice, "playbook.create")).with(Change::InsertPlaybook(procedure.clone()));
    store.commit(&alice, create).await.expect("playbook");
    let mut other = playbook(at);
    other.embedding = Some(unit(&[0.7, 0.7, 0.0]));
    let create = ChangeSet::new(audit(&alice, "playbook.create")).with(Change::InsertPlaybook(other.clone()));
    store.commit(&alice, create).await.expect("playbook");
    assert_eq!(
        nearest_in(store.as_ref(), &alice, Tier::Procedural, &query, false).await,
        vec![procedure.id.clone(), other.id.clone()]
    );
    let mut revised = procedure.clone();
    revised.version = 2;
    revised.steps.push("announce it".into());
    revised.embedding = Some(unit(&[0.0, 1.0, 0.0]));
    let append = ChangeSet::new(audit(&alice, "playbook.version")).with(Change::AppendPlaybookVersion {
        expected_version: 1,
        playbook: revised,
    });
    store.commit(&alice, append).await.expect("version 2");
    assert_eq!(
        nearest_in(store.as_ref(), &alice, Tier::Procedural, &query, false).await,
        vec![other.id.clone(), procedure.id.clone()],
        "the new version is scored by its own vector"
    );
}

fn episode(text: &str, at: DateTime<Utc>) -> Episode {
    Episode {
        id: new_id("epi"),
        session_id: None,
        text: text.to_owned(),
        occurred_at: at,
        ingested_at: at,
        embedding: None,
    }
}

pub async fn the_watermark_moves_only_from_where_it_is(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let texts = ["first", "second", "third", "fourth"];
    for text in texts {
        ingest_episodes(store.as_ref(), &alice, vec![episode(text, now)]).await;
    }
    ingest_episodes(store.as_ref(), &bob, vec![episode("bob's", now)]).await;

    assert_eq!(store.watermark(&alice).await.expect("watermark"), 0);
    let all = store.episodes_after(&alice, 0, 10).await.expect("log");
    let seen: Vec<&str> = all.iter().map(|logged| logged.episode.text.as_str()).collect();
    assert_eq!(
        seen, texts,
        "the log is in ingest order and holds only this scope"
    );
    assert!(all.windows(2).all(|pair| pair[0].position < pair[1].position));

    let first_two = store.episodes_after(&alice, 0, 2).await.expect("log");
    assert_eq!(first_two.len(), 2);
    let mark = first_two[1].position;
    let rest = store.episodes_after(&alice, mark, 10).await.expect("log");
    assert_eq!(
        rest.iter()
            .map(|logged| logged.episode.text.as_str())
            .collect::<Vec<_>>(),
        ["third", "fourth"]
    );
    let earlier = store.episodes_up_to(&alice, mark, 1).await.expect("log");
    assert_eq!(earlier.len(), 1);
    assert_eq!(
        earlier[0].episode.text, "second",
        "the newest at or before the mark"
    );

    let advance = ChangeSet::new(audit(&alice, "consolidation.run")).with(Change::MoveWatermark {
        expected: 0,
        to: mark,
    });
    store.commit(&alice, advance).await.expect("advance");
    assert_eq!(store.watermark(&alice).await.expect("watermark"), mark);
    assert_eq!(
        store.watermark(&bob).await.expect("watermark"),
        0,
        "watermarks are per scope"
    );

    // A second run that read the old watermark cannot apply its batch.
    let stale = ChangeSet::new(audit(&alice, "consolidation.run"))
        .with(Change::InsertFact(fact("written by a stale run", now)))
        .with(Change::MoveWatermark {
            expected: 0,
            to: mark,
        });
    match store.commit(&alice, stale).await {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "watermark_moved"),
        other => panic!("expected watermark_moved, got {other:?}"),
    }
    let facts = store
        .list_facts(
            &alice,
            StatusFilter::All,
            Utc::now(),
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("list");
    assert!(facts.items.is_empty(), "the stale batch wrote nothing");

    let tombstone = Tombstone {
        id: new_id("tomb"),
        fingerprint: fingerprint("some value"),
        fact_id: "fact_x".into(),
        reason: TombstoneReason::Retracted,
        created_at: now,
        lifted_at: None,
    };
    let set = ChangeSet::new(audit(&alice, "fact.retract")).with(Change::InsertTombstone(tombstone.clone()));
    store.commit(&alice, set).await.expect("tombstone");
    let listed = store.list_tombstones(&alice).await.expect("tombstones");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, tombstone.id);
    assert!(store.list_tombstones(&bob).await.expect("tombstones").is_empty());
}

/// What a consolidation batch derived commits only while its episodes are stored: a
/// batch prepared before its scope was erased writes nothing afterwards, whatever the
/// watermark then reads.
pub async fn derived_writes_need_their_episodes(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let said = episode("I live in Porto", now);
    ingest_episodes(store.as_ref(), &alice, vec![said.clone()]).await;
    let bobs = episode("I live in Braga", now);
    ingest_episodes(store.as_ref(), &bob, vec![bobs.clone()]).await;
    let batch = |text: &str, episode_ids: Vec<String>| {
        let mut derived = fact(text, now);
        derived.source_episode_ids = episode_ids.clone();
        let decision = cairn_core::Decision {
            id: new_id("dec"),
            kind: cairn_core::DecisionKind::New,
            reason: format!("derived: {text}"),
            fact_id: Some(derived.id.clone()),
            target_ids: Vec::new(),
            origin: "run_conformance".into(),
            created_at: now,
        };
        ChangeSet::new(audit(&alice, "consolidation.run"))
            .with(Change::RequireEpisodes(episode_ids))
            .with(Change::InsertFact(derived))
            .with(Change::MoveWatermark { expected: 0, to: 1 })
            .with_decision(decision)
    };
    let everything = |store: Arc<dyn MemoryStore>, scope: Scope| async move {
        let page = PageRequest {
            limit: 10,
            cursor: None,
        };
        let facts = store
            .list_facts(&scope, StatusFilter::All, Utc::now(), &page)
            .await
            .expect("facts");
        let decisions = store
            .list_decisions(&scope, None, &page)
            .await
            .expect("decisions");
        (facts.items.len(), decisions.items.len())
    };

    // Another scope's episode is not evidence here, even with the same text.
    match store
        .commit(&alice, batch("The user lives in Braga", vec![bobs.id.clone()]))
        .await
    {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "evidence_erased"),
        other => panic!("expected evidence_erased, got {other:?}"),
    }
    assert_eq!(everything(Arc::clone(&store), alice.clone()).await, (0, 0));

    let prepared = batch("The user lives in Porto", vec![said.id.clone()]);
    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    // The watermark of an erased scope reads 0, as the batch expects: only the
    // evidence precondition stops it.
    assert_eq!(store.watermark(&alice).await.expect("watermark"), 0);
    match store.commit(&alice, prepared).await {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "evidence_erased"),
        other => panic!("expected evidence_erased, got {other:?}"),
    }
    assert_eq!(
        everything(Arc::clone(&store), alice.clone()).await,
        (0, 0),
        "nothing of the erased scope reappears"
    );
    assert_eq!(store.watermark(&alice).await.expect("watermark"), 0);

    // With the evidence stored, the same kind of batch commits.
    let again = episode("I live in Porto now", now);
    ingest_episodes(store.as_ref(), &alice, vec![again.clone()]).await;
    store
        .commit(&alice, batch("The user lives in Porto", vec![again.id.clone()]))
        .await
        .expect("a batch with its evidence commits");
    assert_eq!(everything(Arc::clone(&store), alice.clone()).await, (1, 1));
}

/// An erasure advances the scope's generation: a change that read the scope before it
/// (and requires that generation) writes nothing, whatever it is; one made at the new
/// generation commits, and consolidation reads only what came after the erasure.
pub async fn erasure_fences_what_began_before_it(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let before = store.generation(&alice).await.expect("generation");
    assert_eq!(before, 0, "a scope never erased is at generation 0");
    let said = episode("I keep bees on the roof", now);
    ingest_episodes(store.as_ref(), &alice, vec![said.clone()]).await;
    insert(store.as_ref(), &bob, &fact("The user keeps bees", now)).await;

    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    let after = store.generation(&alice).await.expect("generation");
    assert!(
        after > before,
        "erasure advances the generation: {before} -> {after}"
    );
    assert_eq!(
        store.generation(&bob).await.expect("generation"),
        0,
        "another scope's generation stays"
    );

    let erased = |result: cairn_core::Result<()>, what: &str| match result {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "scope_erased", "{what}"),
        other => panic!("{what}: expected scope_erased, got {other:?}"),
    };
    let late = fact("The user keeps bees", now);
    let fenced = ChangeSet::new(audit(&alice, "fact.create"))
        .with(Change::RequireGeneration(before))
        .with(Change::InsertFact(late.clone()));
    erased(store.commit(&alice, fenced).await, "a fact");
    assert!(store.get_fact(&alice, &late.id).await.expect("get").is_none());
    let late_episode = episode("I keep wasps as well", now);
    let fenced_ingest = ingest(&alice, vec![late_episode.clone()]).with(Change::RequireGeneration(before));
    erased(store.commit(&alice, fenced_ingest).await, "an ingest");
    assert!(
        store
            .get_episode(&alice, &late_episode.id)
            .await
            .expect("get")
            .is_none()
    );
    let page = PageRequest {
        limit: 10,
        cursor: None,
    };
    assert!(
        store
            .list_facts(&alice, StatusFilter::All, Utc::now(), &page)
            .await
            .expect("facts")
            .items
            .is_empty(),
        "nothing of a fenced change is stored"
    );

    // Made at the new generation, the same change commits.
    let current = ChangeSet::new(audit(&alice, "fact.create"))
        .with(Change::RequireGeneration(after))
        .with(Change::InsertFact(late.clone()));
    store
        .commit(&alice, current)
        .await
        .expect("a change at the new generation");
    assert!(store.get_fact(&alice, &late.id).await.expect("get").is_some());

    // Consolidation reads on from the start of the erased scope's log: only what came
    // after the erasure.
    let fresh = episode("I keep bees again", now);
    ingest_episodes(store.as_ref(), &alice, vec![fresh.clone()]).await;
    let watermark = store.watermark(&alice).await.expect("watermark");
    let log = store.episodes_after(&alice, watermark, 10).await.expect("log");
    assert_eq!(
        log.iter()
            .map(|logged| logged.episode.id.clone())
            .collect::<Vec<_>>(),
        vec![fresh.id.clone()]
    );
    assert_eq!(
        store.gap_after(&alice, log[0].position).await.expect("gap"),
        None,
        "nothing reserved and unwritten waits after the last episode"
    );

    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase again");
    assert!(store.generation(&alice).await.expect("generation") > after);
}

/// An import claims its scope in the store: another import's claim is refused
/// (`scope_not_empty`) until released, gone stale or ended by an erasure; the holder
/// renews its own; other scopes are not affected.
pub async fn imports_claim_the_scope_one_at_a_time(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let stale = now - Duration::minutes(10);
    let refused = |result: cairn_core::Result<()>, what: &str| match result {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "scope_not_empty", "{what}"),
        other => panic!("{what}: expected scope_not_empty, got {other:?}"),
    };
    store
        .claim_import(&alice, "first", now, stale)
        .await
        .expect("a free scope is claimed");
    refused(
        store.claim_import(&alice, "second", now, stale).await,
        "a second import",
    );
    store
        .claim_import(&alice, "first", now + Duration::seconds(1), stale)
        .await
        .expect("the holder renews its claim");
    store
        .claim_import(&bob, "second", now, stale)
        .await
        .expect("another scope is free");
    store
        .release_import(&alice, "second")
        .await
        .expect("releasing another's claim changes nothing");
    refused(
        store.claim_import(&alice, "second", now, stale).await,
        "still held",
    );
    store.release_import(&alice, "first").await.expect("release");
    store
        .claim_import(&alice, "second", now, stale)
        .await
        .expect("released, the scope is claimed by the next import");
    // A claim not renewed since before the bound was left by a process that stopped.
    store
        .claim_import(&alice, "third", now, now + Duration::seconds(5))
        .await
        .expect("a stale claim is taken over");
    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    store
        .claim_import(&alice, "fourth", now, stale)
        .await
        .expect("an erasure ends every claim");
}

/// Scope A holds every kind of record; every read method of the port, called as
/// another tenant with the same user id and as another user of A's tenant, finds none
/// of it, and their writes aimed at A's records change nothing of A.
pub async fn no_read_crosses_a_scope(store: Arc<dyn MemoryStore>) {
    store.ping().await.expect("a fresh store answers");
    let owner = scope("acme", "alice");
    let at = Utc::now() - Duration::minutes(1);
    let vector = unit(&[0.6, 0.8, 0.0]);
    let mut said = episode("Alice's marmalade recipe uses Seville oranges", at);
    said.session_id = Some("s1".into());
    said.embedding = Some(vector.clone());
    ingest_episodes(store.as_ref(), &owner, vec![said.clone()]).await;
    let mut current = fact("Alice keeps marmalade in the pantry", at);
    current.embedding = Some(vector.clone());
    let mut old = fact("Alice keeps marmalade in the cellar", at - Duration::seconds(1));
    old.embedding = Some(vector.clone());
    insert(store.as_ref(), &owner, &old).await;
    store
        .commit(&owner, supersede(&owner, &old, &current))
        .await
        .expect("supersede");
    let mut wrong = fact("Alice hates marmalade", at);
    wrong.embedding = Some(vector.clone());
    insert(store.as_ref(), &owner, &wrong).await;
    let tombstone = Tombstone {
        id: new_id("tomb"),
        fingerprint: fingerprint(&wrong.text),
        fact_id: wrong.id.clone(),
        reason: TombstoneReason::Retracted,
        created_at: at,
        lifted_at: None,
    };
    let retract = ChangeSet::new(audit(&owner, "fact.retract"))
        .with(Change::RetractFact {
            fact_id: wrong.id.clone(),
            reason: Some("never true".into()),
            at,
        })
        .with(Change::InsertTombstone(tombstone.clone()));
    store.commit(&owner, retract).await.expect("retract");
    let mut procedure = playbook(at);
    procedure.embedding = Some(vector.clone());
    let mut second = procedure.clone();
    second.version = 2;
    second.steps.push("label the jars".into());
    let decision = cairn_core::Decision {
        id: new_id("dec"),
        kind: cairn_core::DecisionKind::New,
        reason: "marmalade playbook".into(),
        fact_id: None,
        target_ids: vec![procedure.id.clone()],
        origin: "api".into(),
        created_at: at,
    };
    let pending = job(&owner, at);
    let set = ChangeSet::new(audit(&owner, "playbook.create"))
        .with(Change::InsertPlaybook(procedure.clone()))
        .with(Change::EnqueueJob(pending.clone()))
        .with_decision(decision);
    store.commit(&owner, set).await.expect("playbook");
    let set = ChangeSet::new(audit(&owner, "playbook.version")).with(Change::AppendPlaybookVersion {
        expected_version: 1,
        playbook: second,
    });
    store.commit(&owner, set).await.expect("version 2");
    let mark = store.episodes_after(&owner, 0, 10).await.expect("log")[0].position;
    let set = ChangeSet::new(audit(&owner, "consolidation.run")).with(Change::MoveWatermark {
        expected: 0,
        to: mark,
    });
    store.commit(&owner, set).await.expect("watermark");
    let fact_ids = [&current.id, &old.id, &wrong.id];
    let page = PageRequest {
        limit: 100,
        cursor: None,
    };

    for outsider in [scope("evil", "alice"), scope("acme", "bob")] {
        let who = format!("{}/{}", outsider.tenant(), outsider.user());
        for id in fact_ids {
            assert!(
                store.get_fact(&outsider, id).await.expect("get").is_none(),
                "{who}"
            );
        }
        for status in [StatusFilter::All, StatusFilter::Only(FactStatus::Active)] {
            let listed = store
                .list_facts(&outsider, status, Utc::now(), &page)
                .await
                .expect("list");
            assert!(listed.items.is_empty(), "{who}");
        }
        let by_value = store
            .find_active_facts_by_fingerprint(&outsider, &fingerprint(&current.text))
            .await
            .expect("fingerprint");
        assert!(by_value.is_empty(), "{who}");
        assert!(
            store
                .find_tombstone(&outsider, &tombstone.fingerprint)
                .await
                .expect("tombstone")
                .is_none(),
            "{who}"
        );
        assert!(
            store
                .get_episode(&outsider, &said.id)
                .await
                .expect("episode")
                .is_none(),
            "{who}"
        );
        assert!(
            store
                .list_episodes(&outsider, None, &page)
                .await
                .expect("episodes")
                .items
                .is_empty(),
            "{who}"
        );
        assert!(
            store
                .get_playbook(&outsider, &procedure.id)
                .await
                .expect("playbook")
                .is_none(),
            "{who}"
        );
        match store.playbook_versions(&outsider, &procedure.id).await {
            Ok(versions) => assert!(versions.is_empty(), "{who}"),
            Err(Error::NotFound { .. }) => {}
            Err(other) => panic!("{who}: {other:?}"),
        }
        assert!(
            store
                .list_playbooks(&outsider, &page)
                .await
                .expect("playbooks")
                .items
                .is_empty(),
            "{who}"
        );
        for tier in Tier::ALL {
            let filter = SearchFilter {
                include_history: true,
                limit: 50,
                with_vectors: true,
                ..current_in(tier)
            };
            for session in [None, Some("s1".to_owned())] {
                let filter = SearchFilter {
                    session_id: session,
                    ..filter.clone()
                };
                let text = TextQuery::new(
                    filter.clone(),
                    "marmalade Seville oranges pantry cellar deploy".to_owned(),
                );
                assert!(
                    store
                        .search_text(&outsider, &text)
                        .await
                        .expect("text")
                        .is_empty(),
                    "{who} {tier:?}"
                );
                let knn = VectorQuery {
                    filter,
                    vector: vector.clone(),
                };
                assert!(
                    store
                        .search_vector(&outsider, &knn)
                        .await
                        .expect("knn")
                        .is_empty(),
                    "{who} {tier:?}"
                );
            }
        }
        assert!(
            store
                .list_decisions(&outsider, None, &page)
                .await
                .expect("decisions")
                .items
                .is_empty(),
            "{who}"
        );
        assert!(
            store
                .list_audit(&outsider, &page)
                .await
                .expect("audit")
                .items
                .is_empty(),
            "{who}"
        );
        assert!(
            store
                .list_tombstones(&outsider)
                .await
                .expect("tombstones")
                .is_empty(),
            "{who}"
        );
        assert_eq!(store.watermark(&outsider).await.expect("watermark"), 0, "{who}");
        assert!(
            store
                .episodes_after(&outsider, 0, 100)
                .await
                .expect("after")
                .is_empty(),
            "{who}"
        );
        assert!(
            store
                .episodes_up_to(&outsider, u64::MAX, 100)
                .await
                .expect("up to")
                .is_empty(),
            "{who}"
        );
        assert!(
            store.pending_jobs(&outsider).await.expect("jobs").is_empty(),
            "{who}"
        );

        // Writes aimed at A's records from outside change nothing of A.
        store
            .record_usage(
                &outsider,
                &[current.id.clone(), procedure.id.clone()].map(|id| UseCount {
                    id,
                    count: 1,
                    last_used_at: Utc::now(),
                }),
            )
            .await
            .expect("usage is a no-op for records of another scope");
        let _ = store
            .release_job(
                &outsider,
                &pending.id,
                Utc::now() + Duration::days(1),
                "outsider",
                true,
            )
            .await;
        match store
            .commit(
                &outsider,
                supersede(&outsider, &current, &fact("hijack", Utc::now())),
            )
            .await
        {
            Err(Error::NotFound { .. }) => {}
            other => panic!("{who}: superseding another scope's fact gave {other:?}"),
        }
        let receipt = store
            .erase_scope(&outsider, audit(&outsider, "user.erase"))
            .await
            .expect("erase");
        assert_eq!(receipt, cairn_core::ErasureReceipt::default(), "{who}");
    }

    // A is whole.
    let facts = store
        .list_facts(&owner, StatusFilter::All, Utc::now(), &page)
        .await
        .expect("list");
    assert_eq!(facts.items.len(), 3, "current, old and retracted; no hijack");
    let unused = store
        .get_fact(&owner, &current.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(unused.use_count, 0, "another scope's usage bump touched nothing");
    let jobs = store.pending_jobs(&owner).await.expect("jobs");
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (jobs[0].attempts, jobs[0].last_error.as_deref(), jobs[0].dead_at),
        (0, None, None),
        "another scope can neither fail nor dead-letter the job"
    );
    assert_eq!(
        store
            .list_episodes(&owner, None, &page)
            .await
            .expect("episodes")
            .items
            .len(),
        1
    );
    assert_eq!(store.watermark(&owner).await.expect("watermark"), mark);
}

/// A queued consolidation job of the scope, due at `at`.
pub fn job(scope: &Scope, at: DateTime<Utc>) -> ConsolidationJob {
    ConsolidationJob {
        id: new_id("job"),
        subject: scope.subject().to_owned(),
        request_id: "req_conformance".into(),
        assistant_context: vec!["try the Nimbus 25".into()],
        created_at: at,
        run_after: at,
        attempts: 0,
        last_error: None,
        dead_at: None,
    }
}

pub async fn jobs_are_durable_leased_and_scoped(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("other", "bob");
    let now = Utc::now();
    let queued = job(&alice, now);
    let set = ChangeSet::new(audit(&alice, "episode.ingest")).with(Change::EnqueueJob(queued.clone()));
    store.commit(&alice, set).await.expect("enqueue");
    let pending = store.pending_jobs(&alice).await.expect("jobs");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, queued.id);
    assert_eq!(pending[0].assistant_context, queued.assistant_context);
    assert_eq!(pending[0].subject, queued.subject);
    assert!(store.pending_jobs(&bob).await.expect("jobs").is_empty());
    assert_eq!(store.count_pending_jobs(&alice, 8).await.expect("count"), 1);
    assert_eq!(store.count_pending_jobs(&bob, 8).await.expect("count"), 0);

    let lease = now + Duration::seconds(30);
    let (claimed_scope, claimed) = store
        .claim_job(now, lease, None)
        .await
        .expect("claim")
        .expect("a due job");
    assert_eq!(claimed.id, queued.id);
    assert_eq!(
        claimed_scope, alice,
        "the job comes back with the scope it was enqueued in"
    );
    assert!(
        store.claim_job(now, lease, None).await.expect("claim").is_none(),
        "a leased job is not handed out twice"
    );
    // Retrying a job a worker holds does not take its lease away.
    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "consolidation.retry")).with(Change::RetryJob {
                job_id: queued.id.clone(),
                at: now,
            }),
        )
        .await
        .expect("retry a leased job");
    assert!(
        store.claim_job(now, lease, None).await.expect("claim").is_none(),
        "a retry never steals a live lease"
    );
    // A worker whose run outlives the lease renews it: the job stays its own, with the
    // attempt it counted; another scope cannot renew it.
    let renewed = lease + Duration::seconds(30);
    let bob = scope("acme", "bob");
    assert!(
        !store
            .renew_job(&bob, &queued.id, renewed)
            .await
            .expect("renew elsewhere"),
        "another scope's job is not renewed"
    );
    assert!(store.renew_job(&alice, &queued.id, renewed).await.expect("renew"));
    assert!(
        store
            .claim_job(lease, lease + Duration::seconds(30), None)
            .await
            .expect("claim")
            .is_none(),
        "a renewed lease outlives the first"
    );
    let (_, reclaimed) = store
        .claim_job(renewed, renewed + Duration::seconds(30), None)
        .await
        .expect("claim")
        .expect("an expired lease frees it");
    assert_eq!(
        reclaimed.attempts, 1,
        "the retry cleared the count and this claim counted one; renewing counted none"
    );
    assert!(
        !store
            .renew_job(&alice, "job_missing", renewed)
            .await
            .expect("renew a missing job"),
        "a job that is gone is not renewed"
    );

    let retry_at = now + Duration::minutes(5);
    store
        .release_job(&alice, &queued.id, retry_at, "provider timed out", false)
        .await
        .expect("release");
    assert!(
        store.claim_job(now, lease, None).await.expect("claim").is_none(),
        "not due before its retry time"
    );
    let (_, retried) = store
        .claim_job(retry_at, retry_at + Duration::seconds(30), None)
        .await
        .expect("claim")
        .expect("due");
    // Each claim counts an attempt (a run that kills its worker counts too): the one
    // after the expired lease, and this one.
    assert_eq!(retried.attempts, 2);
    assert_eq!(retried.last_error.as_deref(), Some("provider timed out"));
    // Given back uncounted (its scope ran elsewhere), it is due when said, one attempt
    // fewer.
    store
        .defer_job(&alice, &queued.id, retry_at + Duration::minutes(1))
        .await
        .expect("defer");
    assert!(
        store
            .claim_job(retry_at, retry_at + Duration::seconds(30), None)
            .await
            .expect("claim")
            .is_none(),
        "not due before its new time"
    );
    let (_, deferred) = store
        .claim_job(
            retry_at + Duration::minutes(1),
            retry_at + Duration::minutes(2),
            None,
        )
        .await
        .expect("claim")
        .expect("due");
    assert_eq!(deferred.attempts, 2, "the deferral counted nothing");

    // Completing from another scope touches nothing.
    let foreign =
        ChangeSet::new(audit(&bob, "consolidation.run")).with(Change::CompleteJobs(vec![queued.id.clone()]));
    store.commit(&bob, foreign).await.expect("no-op");
    assert_eq!(store.pending_jobs(&alice).await.expect("jobs").len(), 1);
    let done = ChangeSet::new(audit(&alice, "consolidation.run"))
        .with(Change::CompleteJobs(vec![queued.id.clone()]));
    store.commit(&alice, done).await.expect("complete");
    assert!(store.pending_jobs(&alice).await.expect("jobs").is_empty());
    assert_eq!(store.count_pending_jobs(&alice, 8).await.expect("count"), 0);

    let again = ChangeSet::new(audit(&alice, "episode.ingest")).with(Change::EnqueueJob(job(&alice, now)));
    store.commit(&alice, again).await.expect("enqueue");
    let receipt = store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    assert_eq!(
        receipt.jobs, 1,
        "erasing a scope removes its queued jobs and their context"
    );
    assert!(
        store
            .claim_job(now + Duration::days(1), now + Duration::days(2), None)
            .await
            .expect("claim")
            .is_none()
    );
}

/// One tenant's backlog does not hold the others back: claims take tenants in turn.
/// A dead-lettered job is listed but never claimed until it is retried, and only its
/// own scope can retry it.
pub async fn tenants_take_turns_and_dead_letters_wait_for_a_retry(store: Arc<dyn MemoryStore>) {
    let flood = scope("a-flood", "u");
    let quiet = scope("b-quiet", "u");
    let other = scope("c-other", "u");
    let now = Utc::now() - Duration::seconds(10);
    let enqueue = |scope: &Scope, at: DateTime<Utc>| {
        ChangeSet::new(audit(scope, "episode.ingest")).with(Change::EnqueueJob(job(scope, at)))
    };
    for offset in 0..5 {
        store
            .commit(&flood, enqueue(&flood, now + Duration::milliseconds(offset)))
            .await
            .expect("enqueue");
    }
    store
        .commit(&quiet, enqueue(&quiet, now + Duration::seconds(1)))
        .await
        .expect("enqueue");
    store
        .commit(&other, enqueue(&other, now + Duration::seconds(2)))
        .await
        .expect("enqueue");
    let claim_at = now + Duration::seconds(5);
    let lease = claim_at + Duration::minutes(1);
    let mut served = Vec::new();
    let mut last: Option<String> = None;
    for _ in 0..4 {
        let (scope, _) = store
            .claim_job(claim_at, lease, last.as_deref())
            .await
            .expect("claim")
            .expect("a due job");
        last = Some(scope.tenant().as_str().to_owned());
        served.push(scope.tenant().as_str().to_owned());
    }
    assert_eq!(
        served,
        ["a-flood", "b-quiet", "c-other", "a-flood"],
        "tenants take turns, wrapping around"
    );

    // Dead letters: listed with their error, never claimed, retried only by their scope.
    let stuck = store.pending_jobs(&quiet).await.expect("jobs")[0].clone();
    store
        .release_job(&quiet, &stuck.id, claim_at, "provider keeps failing", true)
        .await
        .expect("dead-letter");
    let listed = store.pending_jobs(&quiet).await.expect("jobs");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].dead_at.is_some());
    assert_eq!(listed[0].last_error.as_deref(), Some("provider keeps failing"));
    let later = claim_at + Duration::days(1);
    let mut claimed_later = Vec::new();
    while let Some((scope, job)) = store
        .claim_job(later, later + Duration::minutes(1), None)
        .await
        .expect("claim")
    {
        claimed_later.push((scope.tenant().as_str().to_owned(), job.id));
    }
    assert!(
        claimed_later.iter().all(|(_, id)| *id != stuck.id),
        "a dead letter is not claimed: {claimed_later:?}"
    );
    let retry = |scope: &Scope| {
        ChangeSet::new(audit(scope, "consolidation.retry")).with(Change::RetryJob {
            job_id: stuck.id.clone(),
            at: later,
        })
    };
    match store.commit(&flood, retry(&flood)).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("another scope retried the job: {other:?}"),
    }
    store.commit(&quiet, retry(&quiet)).await.expect("retry");
    let (scope, job) = store
        .claim_job(later, later + Duration::minutes(1), None)
        .await
        .expect("claim")
        .expect("the retried job is due");
    assert_eq!((scope, job.id.clone()), (quiet.clone(), stuck.id.clone()));
    // Retried: no attempt counted but this claim's, no dead letter, no error.
    assert_eq!((job.attempts, job.dead_at, job.last_error), (1, None, None));
}

/// The lease on a scope's consolidation runs is held by one holder at a time: another
/// is refused until it is released or runs out; the holder renews it; other scopes are
/// free.
pub async fn a_scopes_runs_are_leased_to_one_holder_at_a_time(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let until = now + Duration::seconds(60);
    assert!(
        store
            .lease_scope_runs(&alice, "one", now, until)
            .await
            .expect("lease")
    );
    assert!(
        !store
            .lease_scope_runs(&alice, "two", now, until)
            .await
            .expect("lease"),
        "held by another"
    );
    assert!(
        store
            .lease_scope_runs(
                &alice,
                "one",
                now + Duration::seconds(20),
                until + Duration::seconds(20)
            )
            .await
            .expect("renew"),
        "the holder renews it"
    );
    assert!(
        store
            .lease_scope_runs(&bob, "two", now, until)
            .await
            .expect("lease"),
        "another scope"
    );
    store
        .release_scope_runs(&alice, "two")
        .await
        .expect("release another's");
    assert!(
        !store
            .lease_scope_runs(&alice, "two", now, until)
            .await
            .expect("lease"),
        "releasing another's lease changes nothing"
    );
    assert!(
        store
            .lease_scope_runs(
                &alice,
                "two",
                until + Duration::seconds(21),
                until + Duration::seconds(80)
            )
            .await
            .expect("lease"),
        "a lease that ran out is taken"
    );
    store.release_scope_runs(&alice, "two").await.expect("release");
    assert!(
        store
            .lease_scope_runs(&alice, "three", now, until)
            .await
            .expect("lease"),
        "released"
    );
}

/// A one-time key (a console login ticket's id) is used once across every process
/// sharing the store, until its use expires; another key is independent.
pub async fn a_key_is_used_once_until_it_expires(store: Arc<dyn MemoryStore>) {
    let now = Utc::now();
    let until = now + Duration::seconds(150);
    let key = format!("ui-login:{}", new_id("login"));
    assert!(
        store.use_once(&key, now, until).await.expect("use"),
        "the first use"
    );
    assert!(
        !store.use_once(&key, now, until).await.expect("use"),
        "a second use is refused"
    );
    assert!(
        !store
            .use_once(&key, until - Duration::seconds(1), until)
            .await
            .expect("use"),
        "refused for as long as the first use holds"
    );
    let other = format!("ui-login:{}", new_id("login"));
    assert!(
        store.use_once(&other, now, until).await.expect("use"),
        "another key"
    );
    assert!(
        store
            .use_once(&key, until + Duration::seconds(1), until + Duration::seconds(150))
            .await
            .expect("use"),
        "past its expiry the key is a new one"
    );
}

/// A store that keeps limits for every process keeps each tenant's request-rate bucket
/// and daily token count exactly, under concurrent takes and per tenant; a store that
/// keeps none says so for both (each process then limits on its own).
pub async fn shared_limits_are_exact_under_concurrent_takes(store: Arc<dyn MemoryStore>) {
    let acme = scope("acme", "alice").limits();
    let globex = scope("globex", "alice").limits();
    let quota = cairn_core::RateQuota {
        per_second: 1,
        burst: 5,
    };
    let now = Utc::now();
    let today = now.date_naive();
    let Some(first) = store.take_rate(&acme, quota, 3, 1, now).await.expect("take") else {
        assert_eq!(
            store.spend_tokens(&acme, today, 10).await.expect("spend"),
            None,
            "a store keeps both limits or neither"
        );
        return;
    };
    assert_eq!(first.granted, 3);
    let rest = store
        .take_rate(&acme, quota, 3, 1, now)
        .await
        .expect("take")
        .expect("kept");
    assert_eq!(rest.granted, 2, "what is left of the burst");
    let refused = store
        .take_rate(&acme, quota, 1, 1, now)
        .await
        .expect("take")
        .expect("kept");
    assert_eq!((refused.granted, refused.retry_after.as_secs()), (0, 1));
    let other = store
        .take_rate(&globex, quota, 5, 5, now)
        .await
        .expect("take")
        .expect("kept");
    assert_eq!(other.granted, 5, "each tenant has its own bucket");

    // Ten takes at once from a full bucket of five: exactly five cells in all.
    let later = now + Duration::seconds(60);
    let takes = (0..10).map(|_| {
        let store = Arc::clone(&store);
        let acme = acme.clone();
        tokio::spawn(async move { store.take_rate(&acme, quota, 1, 1, later).await })
    });
    let mut granted = 0;
    for take in takes {
        granted += take.await.expect("join").expect("take").expect("kept").granted;
    }
    assert_eq!(granted, 5, "concurrent takes share one bucket");

    assert_eq!(store.spend_tokens(&acme, today, 0).await.expect("read"), Some(0));
    let spends = (0..6).map(|_| {
        let store = Arc::clone(&store);
        let acme = acme.clone();
        tokio::spawn(async move { store.spend_tokens(&acme, today, 100).await })
    });
    for spend in spends {
        spend.await.expect("join").expect("spend");
    }
    assert_eq!(
        store.spend_tokens(&acme, today, 0).await.expect("read"),
        Some(600)
    );
    assert_eq!(
        store.spend_tokens(&acme, today, 50).await.expect("spend"),
        Some(650)
    );
    assert_eq!(
        store.spend_tokens(&globex, today, 0).await.expect("read"),
        Some(0)
    );
    let tomorrow = today.succ_opt().expect("a next day");
    assert_eq!(
        store.spend_tokens(&acme, tomorrow, 0).await.expect("read"),
        Some(0),
        "a new day starts from zero"
    );
}

/// Every tenant's pending review queue, deepest first, for the operator's metrics:
/// resolved and erased reviews are not counted.
pub async fn review_queues_are_counted_per_tenant(store: Arc<dyn MemoryStore>) {
    let start = Utc::now() - Duration::seconds(60);
    let mut held = Vec::new();
    for (offset, (tenant, user, text)) in [
        ("acme", "alice", "The user owns a kayak"),
        ("acme", "bob", "The user owns a canoe"),
        ("globex", "carol", "The user owns a raft"),
        ("initech", "dave", "The user owns a yacht"),
    ]
    .into_iter()
    .enumerate()
    {
        let owner = scope(tenant, user);
        let pending = Fact {
            status: FactStatus::Pending,
            ..fact(text, start + Duration::seconds(offset as i64))
        };
        let waiting = review(ReviewKind::NewFact, &pending, None, pending.created_at);
        store
            .commit(&owner, hold(&owner, &pending, &waiting))
            .await
            .expect("hold");
        held.push((owner, waiting));
    }
    store
        .erase_scope(&held[3].0, audit(&held[3].0, "user.erase"))
        .await
        .expect("erase");
    let queues = store.review_queues(10).await.expect("queues");
    let counted: Vec<(String, u64)> = queues
        .iter()
        .map(|queue| (queue.tenant.clone(), queue.pending))
        .collect();
    assert_eq!(counted, vec![("acme".to_owned(), 2), ("globex".to_owned(), 1)]);
    let oldest = queues[0].oldest.expect("the oldest pending review");
    assert!(
        (oldest - start).num_seconds().abs() <= 1,
        "{oldest} against {start}"
    );
    assert_eq!(store.review_queues(1).await.expect("queues").len(), 1);
}

/// A scope's audit key is created once, kept through the scope's other state changes,
/// never shared with another scope, and destroyed by erasing the scope.
pub async fn audit_keys_belong_to_their_scope_and_die_with_it(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    assert_eq!(store.audit_key(&alice, [1; 32]).await.expect("key"), vec![1; 32]);
    assert_eq!(
        store.audit_key(&alice, [2; 32]).await.expect("key"),
        vec![1; 32],
        "the stored key stays"
    );
    assert_eq!(store.audit_key(&bob, [3; 32]).await.expect("key"), vec![3; 32]);
    ingest_episodes(store.as_ref(), &alice, vec![episode("first", Utc::now())]).await;
    let mark = store.episodes_after(&alice, 0, 1).await.expect("log")[0].position;
    let advance = ChangeSet::new(audit(&alice, "consolidation.run")).with(Change::MoveWatermark {
        expected: 0,
        to: mark,
    });
    store.commit(&alice, advance).await.expect("advance");
    assert_eq!(store.watermark(&alice).await.expect("watermark"), mark);
    assert_eq!(
        store.audit_key(&alice, [5; 32]).await.expect("key"),
        vec![1; 32],
        "the key survives the scope's other state"
    );
    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    assert_eq!(
        store.audit_key(&alice, [4; 32]).await.expect("key"),
        vec![4; 32],
        "erasure destroyed the old key"
    );
    assert_eq!(store.audit_key(&bob, [6; 32]).await.expect("key"), vec![3; 32]);

    // The tenant's key: one for all its users, kept through a user's erasure.
    assert_eq!(store.tenant_key(&alice, [7; 32]).await.expect("key"), vec![7; 32]);
    assert_eq!(store.tenant_key(&bob, [8; 32]).await.expect("key"), vec![7; 32]);
    store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    assert_eq!(store.tenant_key(&alice, [9; 32]).await.expect("key"), vec![7; 32]);
    let other = scope("globex", "alice");
    assert_eq!(store.tenant_key(&other, [5; 32]).await.expect("key"), vec![5; 32]);
}

/// Reads that return a whole set (tombstones, queued jobs) return all of it, however
/// large: a tombstone past any page size still blocks its value.
pub async fn whole_set_reads_are_never_cut_short(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let at = Utc::now() - Duration::minutes(1);
    let mut tombstones = ChangeSet::new(audit(&alice, "fact.forget"));
    for index in 0..1_100 {
        tombstones.changes.push(Change::InsertTombstone(Tombstone {
            id: new_id("tomb"),
            fingerprint: fingerprint(&format!("forgotten value number {index}")),
            fact_id: format!("fact_{index}"),
            reason: TombstoneReason::Forgotten,
            created_at: at + Duration::milliseconds(index),
            lifted_at: None,
        }));
    }
    store.commit(&alice, tombstones).await.expect("tombstones");
    let listed = store.list_tombstones(&alice).await.expect("tombstones");
    assert_eq!(listed.len(), 1_100);
    let distinct: std::collections::HashSet<&str> =
        listed.iter().map(|tombstone| tombstone.id.as_str()).collect();
    assert_eq!(distinct.len(), 1_100, "no tombstone listed twice");
    assert!(
        store
            .find_tombstone(&alice, &fingerprint("forgotten value number 0"))
            .await
            .expect("find")
            .is_some(),
        "the oldest tombstone still blocks its value"
    );
    let mut jobs = ChangeSet::new(audit(&alice, "episode.ingest"));
    for index in 0..1_001 {
        jobs.changes.push(Change::EnqueueJob(job(
            &alice,
            at + Duration::milliseconds(index),
        )));
    }
    store.commit(&alice, jobs).await.expect("jobs");
    assert_eq!(store.pending_jobs(&alice).await.expect("jobs").len(), 1_001);
    for (up_to, counted) in [(8, 8), (1_001, 1_001), (5_000, 1_001)] {
        assert_eq!(
            store.count_pending_jobs(&alice, up_to).await.expect("count"),
            counted,
            "jobs counted up to {up_to}"
        );
    }
}

/// A write that requires its value not to be active fails as a `duplicate` once an
/// identical fact is active, and passes again when that fact is no longer active.
pub async fn an_active_value_is_held_once(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let at = Utc::now() - Duration::minutes(1);
    let unique = |scope: &Scope, fact: &Fact| {
        ChangeSet::new(audit(scope, "fact.create"))
            .with(Change::RequireNoActiveValue {
                fingerprint: fingerprint(&fact.text),
            })
            .with(Change::InsertFact(fact.clone()))
    };
    let first = fact("The user plays the oboe", at);
    store.commit(&alice, unique(&alice, &first)).await.expect("first");
    let second = fact("the user plays the OBOE!", at);
    match store.commit(&alice, unique(&alice, &second)).await {
        Err(Error::Conflict { code, .. }) => assert_eq!(code, "duplicate"),
        other => panic!("expected duplicate, got {other:?}"),
    }
    store
        .commit(&bob, unique(&bob, &fact("the user plays the OBOE!", at)))
        .await
        .expect("another scope's value is no duplicate");
    let replacement = fact("The user plays the bassoon", at + Duration::seconds(1));
    store
        .commit(&alice, supersede(&alice, &first, &replacement))
        .await
        .expect("supersede");
    store
        .commit(&alice, unique(&alice, &fact("The user plays the oboe", at)))
        .await
        .expect("a value no longer active may be written again");
}

/// Full-text scores come from the scope's own records: what other tenants (or other
/// users of the tenant) store never moves them, so a score cannot tell anyone how often
/// a word occurs in someone else's memory.
pub async fn text_scores_use_only_the_scopes_statistics(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let outsiders = [scope("evil", "alice"), scope("acme", "bob")];
    let now = Utc::now();
    let episode = |session: &str, text: &str| cairn_core::Episode {
        id: new_id("epi"),
        session_id: Some(session.to_owned()),
        text: text.to_owned(),
        occurred_at: now,
        ingested_at: now,
        embedding: None,
    };
    for text in [
        "The user runs marathons in Lisbon",
        "The user collects vintage cameras",
        "The user repairs cameras for friends",
        "The user keeps cameras in a drawer",
    ] {
        insert(store.as_ref(), &alice, &fact(text, now)).await;
    }
    ingest_episodes(
        store.as_ref(),
        &alice,
        vec![
            episode("s1", "Which city is the marathon in?"),
            episode("s1", "Lisbon, in October."),
            episode("s2", "My cameras need new film."),
        ],
    )
    .await;
    let scores = |tier: Tier| {
        let store = Arc::clone(&store);
        let alice = alice.clone();
        async move {
            let filter = SearchFilter {
                limit: 50,
                with_vectors: true,
                ..current_in(tier)
            };
            store
                .search_text(&alice, &TextQuery::new(filter, "lisbon cameras"))
                .await
                .expect("search")
                .into_iter()
                .map(|hit| (hit.memory.id().to_owned(), hit.score))
                .collect::<Vec<_>>()
        }
    };
    let facts_before = scores(Tier::Semantic).await;
    let episodes_before = scores(Tier::Episodic).await;
    assert_eq!(facts_before.len(), 4, "{facts_before:?}");
    assert_eq!(episodes_before.len(), 3, "{episodes_before:?}");
    // In alice's records "lisbon" is rarer than "cameras", so it weighs more.
    let lisbon = facts_before[0].1;
    assert!(
        facts_before[1..].iter().all(|(_, score)| *score < lisbon),
        "{facts_before:?}"
    );
    assert!(
        facts_before
            .iter()
            .all(|(_, score)| score.is_finite() && *score > 0.0)
    );

    // Others fill their memory with one of the words, at scale.
    for outsider in &outsiders {
        for index in 0..30 {
            let text = format!("The user has cameras number {index} and {} more", index + 1);
            insert(store.as_ref(), outsider, &fact(&text, now)).await;
        }
        let episodes = (0..20)
            .map(|index| episode("s9", &format!("Photos of cameras, roll {index}")))
            .collect();
        ingest_episodes(store.as_ref(), outsider, episodes).await;
    }
    for (before, after) in [
        (facts_before, scores(Tier::Semantic).await),
        (episodes_before, scores(Tier::Episodic).await),
    ] {
        assert_eq!(before.len(), after.len(), "{before:?} {after:?}");
        for ((id_before, score_before), (id_after, score_after)) in before.iter().zip(&after) {
            assert_eq!(id_before, id_after, "the order moved: {before:?} {after:?}");
            assert!(
                (score_before - score_after).abs() < 1e-9,
                "a score moved with other scopes' records: {before:?} {after:?}"
            );
        }
    }
}

/// The tenant's user list counts each user's records, pages by user id, and shows
/// nothing of another tenant, even one with the same user ids.
pub async fn users_are_listed_per_tenant(store: Arc<dyn MemoryStore>) {
    let now = Utc::now();
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let mallory = scope("evil", "alice");
    let episode = |text: &str| cairn_core::Episode {
        id: new_id("epi"),
        session_id: None,
        text: text.to_owned(),
        occurred_at: now,
        ingested_at: now,
        embedding: None,
    };
    ingest_episodes(store.as_ref(), &alice, vec![episode("one"), episode("two")]).await;
    let old = fact("The user lives in Lyon", now);
    let new = fact("The user lives in Paris", now + Duration::seconds(1));
    insert(store.as_ref(), &alice, &old).await;
    store
        .commit(&alice, supersede(&alice, &old, &new))
        .await
        .expect("supersede");
    insert(store.as_ref(), &bob, &fact("The user rows", now)).await;
    for index in 0..3 {
        insert(
            store.as_ref(),
            &mallory,
            &fact(&format!("Mallory's fact {index}"), now),
        )
        .await;
    }
    ingest_episodes(store.as_ref(), &mallory, vec![episode("three")]).await;

    let all = PageRequest {
        limit: 10,
        cursor: None,
    };
    let acme = store
        .list_users(&tenant_scope("acme"), &all)
        .await
        .expect("users");
    assert_eq!(acme.next_cursor, None);
    let summary: Vec<(String, u64, u64, u64, u64)> = acme
        .items
        .iter()
        .map(|user| {
            (
                user.user.clone(),
                user.episodes,
                user.facts,
                user.active_facts,
                user.playbooks,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![("alice".to_owned(), 2, 2, 1, 0), ("bob".to_owned(), 0, 1, 1, 0)]
    );
    let latest = acme.items[0].last_activity.expect("activity");
    assert!(latest >= now, "{latest} {now}");

    let first = store
        .list_users(
            &tenant_scope("acme"),
            &PageRequest {
                limit: 1,
                cursor: None,
            },
        )
        .await
        .expect("first page");
    assert_eq!(first.items.len(), 1);
    assert_eq!(first.items[0].user, "alice");
    let second = store
        .list_users(
            &tenant_scope("acme"),
            &PageRequest {
                limit: 1,
                cursor: first.next_cursor,
            },
        )
        .await
        .expect("second page");
    assert_eq!(
        second
            .items
            .iter()
            .map(|user| user.user.as_str())
            .collect::<Vec<_>>(),
        vec!["bob"]
    );
    let third = store
        .list_users(
            &tenant_scope("acme"),
            &PageRequest {
                limit: 1,
                cursor: second.next_cursor,
            },
        )
        .await
        .expect("third page");
    assert!(third.items.is_empty() && third.next_cursor.is_none());

    let evil = store
        .list_users(&tenant_scope("evil"), &all)
        .await
        .expect("users");
    assert_eq!(evil.items.len(), 1);
    assert_eq!((evil.items[0].episodes, evil.items[0].facts), (1, 3));
    assert!(
        store
            .list_users(&tenant_scope("nobody"), &all)
            .await
            .expect("users")
            .items
            .is_empty()
    );

    // An erased user is no longer listed.
    store
        .erase_scope(&bob, audit(&bob, "user.erase"))
        .await
        .expect("erase");
    let after = store
        .list_users(&tenant_scope("acme"), &all)
        .await
        .expect("users");
    assert_eq!(
        after
            .items
            .iter()
            .map(|user| user.user.as_str())
            .collect::<Vec<_>>(),
        vec!["alice"]
    );
}

/// Consolidation compares the vectors of the facts it finds, so a search that asks for
/// vectors gets each hit's embedding, from the text leg and the vector leg alike.
pub async fn search_hits_carry_vectors_when_asked(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let mut record = fact("Alice rows a wooden kayak", Utc::now());
    record.embedding = Some(unit(&[0.2, 0.9, 0.1]));
    insert(store.as_ref(), &alice, &record).await;
    let filter = SearchFilter {
        with_vectors: true,
        ..current_in(Tier::Semantic)
    };
    let by_text = store
        .search_text(&alice, &TextQuery::new(filter.clone(), "kayak"))
        .await
        .expect("text search");
    let by_vector = store
        .search_vector(
            &alice,
            &VectorQuery {
                vector: unit(&[0.2, 0.9, 0.1]),
                filter,
            },
        )
        .await
        .expect("vector search");
    for hits in [by_text, by_vector] {
        let Some(Memory::Fact(found)) = hits.first().map(|hit| &hit.memory) else {
            panic!("the fact is found");
        };
        assert_eq!(found.embedding, record.embedding);
    }
}

/// A recall's legs sent together (`search_texts`, `search_vectors`, `search_legs`) answer exactly as
/// each alone, in order, a query without a searchable word included, and see nothing
/// of another scope.
pub async fn legs_searched_together_answer_as_alone(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let at = Utc::now() - Duration::minutes(1);
    let mut jazz = fact("The user likes jazz records", at);
    jazz.embedding = Some(unit(&[1.0, 0.0, 0.0]));
    insert(store.as_ref(), &alice, &jazz).await;
    let mut elsewhere = fact("The user likes jazz too", at);
    elsewhere.embedding = Some(unit(&[1.0, 0.0, 0.0]));
    insert(store.as_ref(), &scope("acme", "bob"), &elsewhere).await;
    let mut said = episode("I listened to jazz records all evening", at);
    said.embedding = Some(unit(&[0.9, 0.1, 0.0]));
    ingest_episodes(store.as_ref(), &alice, vec![said]).await;
    let mut procedure = playbook(at);
    procedure.embedding = Some(unit(&[0.5, 0.5, 0.0]));
    let create = ChangeSet::new(audit(&alice, "playbook.create")).with(Change::InsertPlaybook(procedure));
    store.commit(&alice, create).await.expect("playbook");

    let filter = current_in;
    let tiers = [Tier::Semantic, Tier::Episodic, Tier::Procedural];
    let mut texts: Vec<TextQuery> = tiers
        .iter()
        .map(|tier| TextQuery::new(filter(*tier), "jazz records"))
        .collect();
    texts.insert(1, TextQuery::new(filter(Tier::Semantic), "?!"));
    let together = store.search_texts(&alice, &texts).await.expect("text legs");
    assert_eq!(together.len(), texts.len());
    let summary = |hits: &[cairn_core::TextHit]| -> Vec<(String, String)> {
        hits.iter()
            .map(|hit| (hit.memory.id().to_owned(), format!("{:.6}", hit.score)))
            .collect()
    };
    for (query, hits) in texts.iter().zip(&together) {
        let alone = store.search_text(&alice, query).await.expect("text leg");
        assert_eq!(
            summary(hits),
            summary(&alone),
            "{:?} {}",
            query.filter.tier,
            query.text
        );
    }
    assert_eq!(together[0].len(), 1, "alice's fact alone");
    assert_eq!(together[0][0].memory.id(), jazz.id);
    assert!(together[1].is_empty(), "no searchable word, no hits");
    assert_eq!(together[2].len(), 1, "the episode");

    let vectors: Vec<VectorQuery> = tiers
        .iter()
        .map(|tier| VectorQuery {
            filter: filter(*tier),
            vector: unit(&[1.0, 0.0, 0.0]),
        })
        .collect();
    let together = store.search_vectors(&alice, &vectors).await.expect("vector legs");
    assert_eq!(together.len(), vectors.len());
    for (query, hits) in vectors.iter().zip(&together) {
        let alone = store.search_vector(&alice, query).await.expect("vector leg");
        assert_eq!(summary(hits), summary(&alone), "{:?}", query.filter.tier);
        assert_eq!(hits.len(), 1, "{:?}: one record of alice's", query.filter.tier);
    }
    assert_eq!(together[0][0].memory.id(), jazz.id);
    assert!(store.search_texts(&alice, &[]).await.expect("none").is_empty());

    // Every leg at once answers as each group alone, in order.
    let (text_legs, vector_legs) = store
        .search_legs(&alice, &texts, &vectors)
        .await
        .expect("every leg");
    let texts_alone = store.search_texts(&alice, &texts).await.expect("text legs");
    assert_eq!(text_legs.len(), texts.len());
    for (hits, alone) in text_legs.iter().zip(&texts_alone) {
        assert_eq!(summary(hits), summary(alone));
    }
    assert_eq!(vector_legs.len(), vectors.len());
    for (hits, alone) in vector_legs.iter().zip(&together) {
        assert_eq!(summary(hits), summary(alone));
    }
    let (none, vector_only) = store
        .search_legs(&alice, &[], &vectors)
        .await
        .expect("vector legs only");
    assert!(none.is_empty());
    assert_eq!(vector_only.len(), vectors.len());
}

pub async fn decisions_filter_by_kind_and_page(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let now = Utc::now();
    let kinds = [
        cairn_core::DecisionKind::New,
        cairn_core::DecisionKind::Duplicate,
        cairn_core::DecisionKind::New,
        cairn_core::DecisionKind::Updates,
        cairn_core::DecisionKind::New,
    ];
    for (index, kind) in kinds.into_iter().enumerate() {
        let decision = cairn_core::Decision {
            id: new_id("dec"),
            kind,
            reason: format!("decision {index}"),
            fact_id: None,
            target_ids: Vec::new(),
            origin: "run_conformance".into(),
            created_at: now + Duration::milliseconds(index as i64),
        };
        store
            .commit(
                &alice,
                ChangeSet::new(audit(&alice, "consolidation.run")).with_decision(decision),
            )
            .await
            .expect("decision");
    }
    let first = PageRequest {
        limit: 2,
        cursor: None,
    };
    let news = store
        .list_decisions(&alice, Some(cairn_core::DecisionKind::New), &first)
        .await
        .expect("decisions");
    assert_eq!(
        news.items.iter().map(|d| d.reason.as_str()).collect::<Vec<_>>(),
        ["decision 4", "decision 2"],
        "newest first, of the kind asked"
    );
    let rest = store
        .list_decisions(
            &alice,
            Some(cairn_core::DecisionKind::New),
            &PageRequest {
                limit: 2,
                cursor: news.next_cursor.clone(),
            },
        )
        .await
        .expect("decisions");
    assert_eq!(
        rest.items.iter().map(|d| d.reason.as_str()).collect::<Vec<_>>(),
        ["decision 0"]
    );
    assert!(rest.next_cursor.is_none());
    let all = store
        .list_decisions(
            &alice,
            None,
            &PageRequest {
                limit: 10,
                cursor: None,
            },
        )
        .await
        .expect("decisions");
    assert_eq!(all.items.len(), 5);
    let none = store
        .list_decisions(&alice, Some(cairn_core::DecisionKind::Retracted), &first)
        .await
        .expect("decisions");
    assert!(none.items.is_empty() && none.next_cursor.is_none());
    let others = store
        .list_decisions(&bob, Some(cairn_core::DecisionKind::New), &first)
        .await
        .expect("decisions");
    assert!(others.items.is_empty(), "another scope's decisions never show");
}

/// Ids a text or vector leg finds in `tier` at belief time `as_of` and event time
/// `valid_at`.
async fn found_at(
    store: &dyn MemoryStore,
    scope: &Scope,
    tier: Tier,
    query: Result<&str, &[f32]>,
    as_of: DateTime<Utc>,
    valid_at: Option<DateTime<Utc>>,
) -> Vec<String> {
    let filter = SearchFilter {
        as_of,
        valid_at,
        ..current_in(tier)
    };
    let hits = match query {
        Ok(text) => store
            .search_text(scope, &TextQuery::new(filter, text.to_owned()))
            .await
            .expect("text search"),
        Err(vector) => store
            .search_vector(
                scope,
                &VectorQuery {
                    vector: vector.to_vec(),
                    filter,
                },
            )
            .await
            .expect("vector search"),
    };
    let mut ids: Vec<String> = hits.into_iter().map(|hit| hit.memory.id().to_owned()).collect();
    ids.sort();
    ids
}

/// A history backfilled today: belief time (`as_of`) knows nothing of last year, event
/// time (`valid_at`) tells what held then, and a supersession ends the old fact's
/// validity where the new one's begins unless it had its own end.
pub async fn event_time_is_asked_apart_from_belief_time(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    // Stores keep microseconds.
    let now = chrono::SubsecRound::trunc_subsecs(Utc::now() - Duration::minutes(1), 6);
    let days = |count: i64| now - Duration::days(count);
    let mut porto = fact("The user lives in Porto", now);
    porto.valid_from = Some(days(300));
    porto.embedding = Some(unit(&[1.0, 0.0, 0.0]));
    let mut lisbon = fact("The user lives in Lisbon", now);
    lisbon.valid_from = Some(days(90));
    lisbon.embedding = Some(unit(&[0.9, 0.1, 0.0]));
    insert(store.as_ref(), &alice, &porto).await;
    store
        .commit(&alice, supersede(&alice, &porto, &lisbon))
        .await
        .expect("supersede");
    let stored = store
        .get_fact(&alice, &porto.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        stored.valid_to, lisbon.valid_from,
        "validity ends where the new fact's begins"
    );
    // A fact with its own end keeps it (in a scope of its own, so the vector legs
    // below, which admit every record, see the Porto and Lisbon facts alone).
    let work = scope("acme", "alice-work");
    let mut acme = fact("The user works at Acme", now);
    acme.valid_from = Some(days(400));
    acme.valid_to = Some(days(200));
    let mut globex = fact("The user works at Globex", now);
    globex.valid_from = Some(days(100));
    insert(store.as_ref(), &work, &acme).await;
    store
        .commit(&work, supersede(&work, &acme, &globex))
        .await
        .expect("supersede");
    let stored = store
        .get_fact(&work, &acme.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(stored.valid_to, Some(days(200)));
    let said = episode("I live in Porto, by the river", days(200));
    let said = Episode {
        ingested_at: now,
        ..said
    };
    ingest_episodes(store.as_ref(), &alice, vec![said.clone()]).await;

    let lives = Ok("lives");
    let vector = unit(&[1.0, 0.0, 0.0]);
    let later = Utc::now();
    for query in [lives, Err(vector.as_slice())] {
        assert_eq!(
            found_at(
                store.as_ref(),
                &alice,
                Tier::Semantic,
                query,
                later,
                Some(days(200))
            )
            .await,
            vec![porto.id.clone()],
            "what held 200 days ago ({query:?})"
        );
        assert_eq!(
            found_at(
                store.as_ref(),
                &alice,
                Tier::Semantic,
                query,
                later,
                Some(days(30))
            )
            .await,
            vec![lisbon.id.clone()],
            "what holds since ({query:?})"
        );
        assert_eq!(
            found_at(store.as_ref(), &alice, Tier::Semantic, query, later, None).await,
            vec![lisbon.id.clone()],
            "what is current now ({query:?})"
        );
        assert!(
            found_at(store.as_ref(), &alice, Tier::Semantic, query, days(200), None)
                .await
                .is_empty(),
            "Cairn believed nothing 200 days ago: it learned all of it today ({query:?})"
        );
        assert!(
            found_at(
                store.as_ref(),
                &alice,
                Tier::Semantic,
                query,
                days(1),
                Some(days(200))
            )
            .await
            .is_empty(),
            "both clocks: as believed yesterday, nothing was known ({query:?})"
        );
    }
    let works = found_at(
        store.as_ref(),
        &work,
        Tier::Semantic,
        Ok("works"),
        later,
        Some(days(150)),
    )
    .await;
    assert!(
        works.is_empty(),
        "between Acme's end and Globex's start: {works:?}"
    );
    assert_eq!(
        found_at(
            store.as_ref(),
            &work,
            Tier::Semantic,
            Ok("works"),
            later,
            Some(days(300))
        )
        .await,
        vec![acme.id.clone()]
    );
    assert_eq!(
        found_at(
            store.as_ref(),
            &alice,
            Tier::Episodic,
            Ok("river"),
            later,
            Some(days(150))
        )
        .await,
        vec![said.id.clone()],
        "said by then"
    );
    assert!(
        found_at(
            store.as_ref(),
            &alice,
            Tier::Episodic,
            Ok("river"),
            later,
            Some(days(250))
        )
        .await
        .is_empty(),
        "not said yet"
    );
}

/// A review of `fact` (pending) as the use cases hold one.
pub fn review(kind: ReviewKind, fact: &Fact, target_id: Option<&str>, created_at: DateTime<Utc>) -> Review {
    // Stores keep microseconds.
    let created_at = DateTime::from_timestamp_micros(created_at.timestamp_micros()).unwrap_or(created_at);
    Review {
        id: new_id("rev"),
        kind,
        fact_id: fact.id.clone(),
        target_id: target_id.map(str::to_owned),
        rule: kind.as_str().to_owned(),
        reason: "held by the conformance suite".into(),
        decision_id: new_id("dec"),
        evidence_episode_ids: fact.source_episode_ids.clone(),
        fingerprint: fingerprint(&fact.text),
        origin: "api".into(),
        proposed_by: "conformance".into(),
        created_at,
        status: ReviewStatus::Pending,
        resolved_at: None,
        resolved_by: None,
        note: None,
    }
}

fn hold(scope: &Scope, fact: &Fact, review: &Review) -> ChangeSet {
    ChangeSet::new(audit(scope, "fact.hold"))
        .with(Change::InsertFact(fact.clone()))
        .with(Change::InsertReview(review.clone()))
}

fn resolve(scope: &Scope, review: &Review, status: ReviewStatus) -> Change {
    Change::ResolveReview {
        review_id: review.id.clone(),
        status,
        at: Utc::now(),
        by: format!("{}-reviewer", scope.user()),
        note: None,
    }
}

/// Forgetting a fact held for review takes its review with it: none is left that could
/// be neither approved nor rejected, in the queue or its counts. Others stay.
pub async fn forgetting_a_held_fact_takes_its_review(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let start = Utc::now() - Duration::seconds(60);
    let mut held = Vec::new();
    for (offset, text) in ["The user owns a kayak", "The user owns a canoe"]
        .into_iter()
        .enumerate()
    {
        let pending = Fact {
            status: FactStatus::Pending,
            ..fact(text, start + Duration::seconds(offset as i64))
        };
        let waiting = review(ReviewKind::NewFact, &pending, None, pending.created_at);
        store
            .commit(&alice, hold(&alice, &pending, &waiting))
            .await
            .expect("hold");
        held.push((pending, waiting));
    }
    let (forgotten, its_review) = &held[0];
    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.forget")).with(Change::EraseFact {
                fact_id: forgotten.id.clone(),
            }),
        )
        .await
        .expect("forget the held fact");
    assert!(
        store
            .get_review(&alice, &its_review.id)
            .await
            .expect("get")
            .is_none(),
        "its review went with it"
    );
    let page = PageRequest {
        limit: 10,
        cursor: None,
    };
    let queue: Vec<String> = store
        .list_reviews(&alice, &page)
        .await
        .expect("reviews")
        .items
        .into_iter()
        .map(|review| review.id)
        .collect();
    assert_eq!(queue, vec![held[1].1.id.clone()], "the other stays");
    assert_eq!(
        store
            .review_summary(&tenant_scope("acme"))
            .await
            .expect("summary")
            .total(),
        1
    );
}

pub async fn reviews_hold_a_change_until_one_reviewer_decides(store: Arc<dyn MemoryStore>) {
    let alice = scope("acme", "alice");
    let bob = scope("acme", "bob");
    let stranger = scope("globex", "alice");
    let start = Utc::now() - Duration::seconds(60);
    let porto = fact("The user lives in Porto", start);
    insert(store.as_ref(), &alice, &porto).await;
    let lisbon = Fact {
        status: FactStatus::Pending,
        ..fact("The user lives in Lisbon", start + Duration::seconds(1))
    };
    let held = review(
        ReviewKind::Supersession,
        &lisbon,
        Some(&porto.id),
        lisbon.created_at,
    );
    store
        .commit(&alice, hold(&alice, &lisbon, &held))
        .await
        .expect("hold");
    // Held elsewhere: another user of the tenant, and another tenant.
    for (other, text, second) in [
        (&bob, "The user owns a kayak", 2),
        (&stranger, "The user owns a canoe", 3),
    ] {
        let pending = Fact {
            status: FactStatus::Pending,
            ..fact(text, start + Duration::seconds(second))
        };
        let other_review = review(ReviewKind::NewFact, &pending, None, pending.created_at);
        store
            .commit(other, hold(other, &pending, &other_review))
            .await
            .expect("hold elsewhere");
    }

    // A pending fact is found only when asked for, and changes nothing.
    let now = Utc::now();
    assert_eq!(
        search(store.as_ref(), &alice, "lives", now, false).await,
        vec![porto.id.clone()]
    );
    let mut filter = SearchFilter {
        as_of: now,
        include_pending: true,
        ..current_in(Tier::Semantic)
    };
    let mut with_pending: Vec<String> = store
        .search_text(&alice, &TextQuery::new(filter.clone(), "lives"))
        .await
        .expect("search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect();
    with_pending.sort();
    let mut expected = vec![porto.id.clone(), lisbon.id.clone()];
    expected.sort();
    assert_eq!(with_pending, expected);
    filter.with_vectors = true;
    let near: Vec<String> = store
        .search_vector(
            &alice,
            &VectorQuery {
                filter: filter.clone(),
                vector: vec![0.25, -0.5, 1.0],
            },
        )
        .await
        .expect("vector search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect();
    assert!(near.contains(&lisbon.id), "{near:?}");
    filter.include_pending = false;
    let near: Vec<String> = store
        .search_vector(
            &alice,
            &VectorQuery {
                filter,
                vector: vec![0.25, -0.5, 1.0],
            },
        )
        .await
        .expect("vector search")
        .into_iter()
        .map(|hit| hit.memory.id().to_owned())
        .collect();
    assert!(!near.contains(&lisbon.id), "{near:?}");
    let page = PageRequest {
        limit: 10,
        cursor: None,
    };
    let pending = store
        .list_facts(&alice, StatusFilter::Only(FactStatus::Pending), now, &page)
        .await
        .expect("list");
    assert_eq!(pending.items.len(), 1);
    assert_eq!(pending.items[0].id, lisbon.id);
    let active = store
        .list_facts(&alice, StatusFilter::Only(FactStatus::Active), now, &page)
        .await
        .expect("list");
    assert_eq!(
        active.items.iter().map(|f| f.id.clone()).collect::<Vec<_>>(),
        vec![porto.id.clone()]
    );

    // Facts read together: in the order asked, another scope's left out.
    let together = store
        .get_facts(
            &alice,
            &[lisbon.id.clone(), "fact_nowhere".into(), porto.id.clone()],
        )
        .await
        .expect("get facts");
    assert_eq!(
        together
            .iter()
            .map(|f| (f.id.clone(), f.status))
            .collect::<Vec<_>>(),
        vec![
            (lisbon.id.clone(), FactStatus::Pending),
            (porto.id.clone(), FactStatus::Active)
        ]
    );
    assert!(
        store
            .get_facts(&bob, std::slice::from_ref(&porto.id))
            .await
            .expect("get facts")
            .is_empty()
    );

    // The queues: the user's, the tenant's (oldest first, paged), counted by kind.
    assert_eq!(
        store.get_review(&alice, &held.id).await.expect("get"),
        Some(held.clone())
    );
    assert_eq!(store.get_review(&bob, &held.id).await.expect("get"), None);
    let mine = store.list_reviews(&alice, &page).await.expect("queue");
    assert_eq!(mine.items, vec![held.clone()]);
    let tenant = tenant_scope("acme");
    let first = store
        .list_tenant_reviews(
            &tenant,
            &PageRequest {
                limit: 1,
                cursor: None,
            },
        )
        .await
        .expect("tenant queue");
    assert_eq!(first.items.len(), 1);
    assert_eq!(first.items[0].review.id, held.id, "oldest first");
    assert_eq!(first.items[0].user, "alice");
    let second = store
        .list_tenant_reviews(
            &tenant,
            &PageRequest {
                limit: 1,
                cursor: first.next_cursor.clone(),
            },
        )
        .await
        .expect("tenant queue");
    assert_eq!(second.items.len(), 1);
    assert_eq!(second.items[0].review.kind, ReviewKind::NewFact);
    assert_eq!(second.items[0].user, "bob");
    assert!(
        second.next_cursor.is_none(),
        "the other tenant's review is not in this queue"
    );
    let summary = store.review_summary(&tenant).await.expect("summary");
    assert_eq!(
        summary.by_kind,
        vec![(ReviewKind::NewFact, 1), (ReviewKind::Supersession, 1)]
    );
    assert_eq!(summary.total(), 2);
    assert_eq!(
        summary.oldest.map(|at| at.timestamp_micros()),
        Some(held.created_at.timestamp_micros())
    );
    let by_value = store
        .find_reviews_by_fingerprint(&alice, &fingerprint("the user lives in LISBON"))
        .await
        .expect("by value");
    assert_eq!(by_value.len(), 1);
    assert!(
        store
            .find_reviews_by_fingerprint(&bob, &fingerprint(&lisbon.text))
            .await
            .expect("by value")
            .is_empty()
    );

    // Several values read together: the newest pending or rejected review of each
    // value that has one; a value without one and another scope's reviews are left out.
    let open_values = |scope: Scope, texts: Vec<String>| {
        let store = store.clone();
        async move {
            let values: Vec<String> = texts.iter().map(|text| fingerprint(text)).collect();
            store
                .held_or_rejected_values(&scope, &values)
                .await
                .expect("held or rejected values")
        }
    };
    let held_now = open_values(
        alice.clone(),
        vec![lisbon.text.clone(), "the user owns a canoe".into()],
    )
    .await;
    assert_eq!(held_now.len(), 1, "{held_now:?}");
    assert_eq!(
        held_now
            .get(&fingerprint(&lisbon.text))
            .map(|review| review.id.clone()),
        Some(held.id.clone())
    );
    assert!(
        open_values(bob.clone(), vec![lisbon.text.clone()])
            .await
            .is_empty()
    );

    // Two reviewers approve at once: exactly one applies the change.
    let approve = |reviewer: &Scope| {
        ChangeSet::new(audit(reviewer, "review.approve"))
            .with(resolve(reviewer, &held, ReviewStatus::Approved))
            .with(Change::ActivateFact {
                fact_id: lisbon.id.clone(),
                at: Utc::now(),
            })
            .with(Change::SupersedeFact {
                fact_id: porto.id.clone(),
                superseded_by: lisbon.id.clone(),
                at: Utc::now(),
                valid_to: None,
            })
    };
    let (one, two) = tokio::join!(
        store.commit(&alice, approve(&alice)),
        store.commit(&alice, approve(&alice))
    );
    let outcomes = [one, two];
    assert_eq!(
        outcomes.iter().filter(|outcome| outcome.is_ok()).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|outcome| matches!(
            outcome,
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::ReviewResolved | cairn_core::ErrorCode::NotActive,
                ..
            })
        )),
        "{outcomes:?}"
    );
    let approved = store
        .get_review(&alice, &held.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(approved.status, ReviewStatus::Approved);
    assert_eq!(approved.resolved_by.as_deref(), Some("alice-reviewer"));
    assert!(approved.resolved_at.is_some());
    let lisbon_now = store
        .get_fact(&alice, &lisbon.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(lisbon_now.status, FactStatus::Active);
    assert!(lisbon_now.created_at > lisbon.created_at, "learned when approved");
    let porto_now = store
        .get_fact(&alice, &porto.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(porto_now.status, FactStatus::Superseded);
    assert!(
        store
            .list_reviews(&alice, &page)
            .await
            .expect("queue")
            .items
            .is_empty()
    );
    assert_eq!(store.review_summary(&tenant).await.expect("summary").total(), 1);
    assert!(
        open_values(alice.clone(), vec![lisbon.text.clone()])
            .await
            .is_empty(),
        "an approved value is neither held nor rejected"
    );

    // A rejection retracts the pending fact; a second decision is refused.
    let kayak = Fact {
        status: FactStatus::Pending,
        ..fact("The user owns a red kayak", Utc::now())
    };
    let kayak_review = review(ReviewKind::NewFact, &kayak, None, kayak.created_at);
    store
        .commit(&alice, hold(&alice, &kayak, &kayak_review))
        .await
        .expect("hold");
    let reject = || {
        ChangeSet::new(audit(&alice, "review.reject"))
            .with(resolve(&alice, &kayak_review, ReviewStatus::Rejected))
            .with(Change::RetractFact {
                fact_id: kayak.id.clone(),
                reason: Some("rejected in review".into()),
                at: Utc::now(),
            })
    };
    store.commit(&alice, reject()).await.expect("reject");
    let again = store.commit(&alice, reject()).await;
    assert!(
        matches!(
            again,
            Err(Error::Conflict {
                code: cairn_core::ErrorCode::ReviewResolved,
                ..
            })
        ),
        "{again:?}"
    );
    let rejected = store
        .get_fact(&alice, &kayak.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(rejected.status, FactStatus::Retracted);
    let refused = open_values(alice.clone(), vec![kayak.text.clone(), lisbon.text.clone()]).await;
    assert_eq!(
        refused
            .iter()
            .map(|(value, review)| (value.clone(), review.id.clone(), review.status))
            .collect::<Vec<_>>(),
        vec![(
            fingerprint(&kayak.text),
            kayak_review.id.clone(),
            ReviewStatus::Rejected
        )]
    );
    // Another scope cannot decide on this scope's review.
    let foreign = store
        .commit(
            &bob,
            ChangeSet::new(audit(&bob, "review.approve")).with(resolve(
                &bob,
                &kayak_review,
                ReviewStatus::Approved,
            )),
        )
        .await;
    assert!(matches!(foreign, Err(Error::NotFound { .. })), "{foreign:?}");

    // A held value under a tombstone waits as pending; it activates only with the lift.
    let peanuts = fact("The user is allergic to peanuts", Utc::now());
    let tombstone = Tombstone {
        id: new_id("tomb"),
        fingerprint: fingerprint(&peanuts.text),
        fact_id: peanuts.id.clone(),
        reason: TombstoneReason::Forgotten,
        created_at: Utc::now(),
        lifted_at: None,
    };
    store
        .commit(
            &alice,
            ChangeSet::new(audit(&alice, "fact.forget")).with(Change::InsertTombstone(tombstone.clone())),
        )
        .await
        .expect("tombstone");
    let restated = Fact {
        status: FactStatus::Pending,
        ..fact("The user is allergic to peanuts", Utc::now())
    };
    let lift = review(
        ReviewKind::TombstoneLift,
        &restated,
        Some(&tombstone.id),
        restated.created_at,
    );
    store
        .commit(&alice, hold(&alice, &restated, &lift))
        .await
        .expect("a restated value is held");
    let activate = ChangeSet::new(audit(&alice, "review.approve")).with(Change::ActivateFact {
        fact_id: restated.id.clone(),
        at: Utc::now(),
    });
    let refused = store.commit(&alice, activate.clone()).await;
    assert!(matches!(refused, Err(Error::Tombstoned { .. })), "{refused:?}");
    let mut lifted = ChangeSet::new(audit(&alice, "review.approve")).with(Change::LiftTombstone {
        tombstone_id: tombstone.id.clone(),
        at: Utc::now(),
    });
    lifted.changes.extend(activate.changes);
    store.commit(&alice, lifted).await.expect("lift and activate");

    // Erasure removes the scope's reviews and counts them.
    let receipt = store
        .erase_scope(&alice, audit(&alice, "user.erase"))
        .await
        .expect("erase");
    assert_eq!(receipt.reviews, 3);
    assert!(store.get_review(&alice, &held.id).await.expect("get").is_none());
    assert_eq!(
        store.review_summary(&tenant).await.expect("summary").total(),
        1,
        "bob's stays"
    );
}

#[cfg(test)]
mod tests {
    /// Every method of the storage port is called by the conformance suite, so a new
    /// method cannot join the port without a check that every backend keeps it in scope.
    #[test]
    fn the_suite_calls_every_method_of_the_port() {
        let port = include_str!("../../cairn-core/src/store.rs");
        let trait_body = port
            .split("pub trait MemoryStore")
            .nth(1)
            .expect("the MemoryStore trait");
        let methods: Vec<&str> = trait_body
            .lines()
            .filter_map(|line| line.trim().strip_prefix("async fn "))
            .filter_map(|rest| rest.split('(').next())
            .collect();
        assert!(methods.len() > 20, "{methods:?}");
        let suite = include_str!("lib.rs");
        let uncalled: Vec<&&str> = methods
            .iter()
            .filter(|method| !suite.contains(&format!(".{method}(")))
            .collect();
        assert!(
            uncalled.is_empty(),
            "port methods no conformance check calls: {uncalled:?}"
        );
    }
}
