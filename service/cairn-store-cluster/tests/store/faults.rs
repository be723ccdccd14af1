//! Fault injection: a small HTTP/1.1 proxy in front of the real node fails one chosen
//! request of a commit, at every point in turn, in two ways: the request never reaches
//! the node, or it reaches it and the answer is lost. After recovery the store holds
//! the whole commit or none of it. Another repeats each journal write, as a node does
//! when a primary is lost mid-write, and the commit still succeeds. A last test stalls
//! a commit just before its commit point and lets recovery take it over. The last ones
//! hold a commit, an ingest and a recovery at their writes after the commit point while
//! the scope is erased: once released, none leaves anything in the erased scope.

use cairn_core::{
    AuditEvent, Change, ChangeSet, Decision, DecisionKind, Error, Fact, FactStatus, MemoryStore, PageRequest,
    Scope,
};
use cairn_store_cluster::ClusterStore;
use chrono::Utc;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The request never reaches the node; the client gets a 503.
    Refuse,
    /// The node handles the request; the client gets a 503 instead of its answer.
    LoseAnswer,
    /// The request waits until released, then goes through.
    Hold,
    /// The request reaches the node twice and the client gets the second answer, as
    /// when a node repeats a write on a newly promoted primary that already holds it.
    Repeat,
}

#[derive(Default)]
struct State {
    seen: usize,
    fault: Option<(usize, Mode)>,
    /// A fault for the first request whose request line holds the text.
    first: Option<(String, Mode)>,
    fired: bool,
    holding: bool,
    released: bool,
    log: Vec<String>,
}

#[derive(Default)]
struct Control {
    state: Mutex<State>,
    changed: Condvar,
}

impl Control {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Blocks while `waiting` holds of the state.
    fn wait_while(&self, waiting: impl FnMut(&mut State) -> bool) {
        drop(self.changed.wait_while(self.lock(), waiting));
    }
}

/// The proxy: every client connection gets a thread and its own upstream connection.
struct Proxy {
    url: String,
    control: Arc<Control>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let control = Arc::new(Control::default());
        let shared = Arc::clone(&control);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (control, upstream) = (Arc::clone(&shared), upstream.clone());
                std::thread::spawn(move || {
                    let _ = serve(client, &upstream, &control);
                });
            }
        });
        Proxy { url, control }
    }

    /// Counts requests from zero and applies `mode` to request number `at`.
    fn arm(&self, at: usize, mode: Mode) {
        let mut state = self.control.lock();
        *state = State {
            fault: Some((at, mode)),
            ..State::default()
        };
    }

    /// Applies `mode` to the first request from now whose request line holds `text`.
    fn arm_first(&self, text: &str, mode: Mode) {
        let mut state = self.control.lock();
        *state = State {
            first: Some((text.to_owned(), mode)),
            ..State::default()
        };
    }

    /// Stops injecting; whether the fault fired, and the requests seen since `arm`.
    fn disarm(&self) -> (bool, Vec<String>) {
        let mut state = self.control.lock();
        state.fault = None;
        state.first = None;
        state.released = true;
        self.control.changed.notify_all();
        (state.fired, std::mem::take(&mut state.log))
    }

    fn wait_until_holding(&self) {
        self.control.wait_while(|state| !state.holding);
    }

    fn release(&self) {
        self.control.lock().released = true;
        self.control.changed.notify_all();
    }
}

/// One HTTP message: its head (through the blank line) and body, as raw bytes.
fn read_message(reader: &mut impl BufRead, bodiless: bool) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut head = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        head.extend_from_slice(line.as_bytes());
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = Vec::new();
    if bodiless {
        return Ok(Some((head, body)));
    }
    if chunked {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line)?;
            body.extend_from_slice(size_line.as_bytes());
            let size =
                usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            if size == 0 {
                break;
            }
        }
    } else {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    Ok(Some((head, body)))
}

fn unavailable(client: &mut TcpStream) -> std::io::Result<()> {
    let body =
        r#"{"error":{"type":"injected_fault","reason":"fault injected by the test proxy"},"status":503}"#;
    write!(
        client,
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn serve(mut client: TcpStream, upstream: &str, control: &Control) -> std::io::Result<()> {
    let mut requests = BufReader::new(client.try_clone()?);
    let mut node: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while let Some((head, body)) = read_message(&mut requests, false)? {
        let line = String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        let mode = {
            let mut state = control.lock();
            let index = state.seen;
            state.seen += 1;
            state.log.push(line.clone());
            let first = match &state.first {
                Some((text, mode)) if !state.fired && line.contains(text.as_str()) => Some(*mode),
                _ => None,
            };
            match state.fault {
                Some((at, mode)) if at == index => {
                    state.fired = true;
                    Some(mode)
                }
                _ if first.is_some() => {
                    state.fired = true;
                    first
                }
                _ => None,
            }
        };
        if mode == Some(Mode::Refuse) {
            unavailable(&mut client)?;
            continue;
        }
        if mode == Some(Mode::Hold) {
            control.lock().holding = true;
            control.changed.notify_all();
            control.wait_while(|state| !state.released);
        }
        if node.is_none() {
            let stream = TcpStream::connect(upstream)?;
            let reader = BufReader::new(stream.try_clone()?);
            node = Some((stream, reader));
        }
        let Some((stream, answers)) = node.as_mut() else {
            return Ok(());
        };
        stream.write_all(&head)?;
        stream.write_all(&body)?;
        let Some((mut answer_head, mut answer_body)) = read_message(answers, line.starts_with("HEAD "))?
        else {
            return Ok(());
        };
        if mode == Some(Mode::Repeat) {
            stream.write_all(&head)?;
            stream.write_all(&body)?;
            let Some(again) = read_message(answers, line.starts_with("HEAD "))? else {
                return Ok(());
            };
            (answer_head, answer_body) = again;
        }
        if mode == Some(Mode::LoseAnswer) {
            unavailable(&mut client)?;
        } else {
            client.write_all(&answer_head)?;
            client.write_all(&answer_body)?;
        }
    }
    Ok(())
}

/// Two active facts and the change set under test: a new fact supersedes the first,
/// the second is retracted, with a decision and an audit event.
struct World {
    first: Fact,
    second: Fact,
    new: Fact,
    decision: Decision,
    audit: AuditEvent,
}

impl World {
    async fn seed(store: &ClusterStore, scope: &Scope) -> World {
        let now = Utc::now();
        let first = cairn_store_tests::fact("The user lives in Paris", now);
        let second = cairn_store_tests::fact("The user plays chess", now);
        for fact in [&first, &second] {
            store
                .commit(
                    scope,
                    ChangeSet::new(cairn_store_tests::audit(scope, "fact.create"))
                        .with(Change::InsertFact(fact.clone())),
                )
                .await
                .expect("seed");
        }
        let new = cairn_store_tests::fact("The user lives in Lyon", now + chrono::Duration::seconds(1));
        let decision = Decision {
            id: cairn_core::new_id("dec"),
            kind: DecisionKind::Updates,
            reason: "the user moved".into(),
            fact_id: Some(new.id.clone()),
            target_ids: vec![first.id.clone()],
            origin: "api".into(),
            created_at: now,
        };
        let audit = cairn_store_tests::audit(scope, "fact.supersede");
        World {
            first,
            second,
            new,
            decision,
            audit,
        }
    }

    fn change_set(&self) -> ChangeSet {
        let mut change_set = ChangeSet::new(self.audit.clone())
            .with(Change::InsertFact(self.new.clone()))
            .with(Change::SupersedeFact {
                fact_id: self.first.id.clone(),
                superseded_by: self.new.id.clone(),
                at: self.new.created_at,
                valid_to: None,
            })
            .with(Change::RetractFact {
                fact_id: self.second.id.clone(),
                reason: Some("never true".into()),
                at: self.new.created_at,
            });
        change_set.decisions.push(self.decision.clone());
        change_set
    }

    /// Asserts that the store holds all of the change set or none of it; returns which.
    async fn whole(&self, store: &ClusterStore, scope: &Scope) -> bool {
        let get = |id: String| async move { store.get_fact(scope, &id).await.expect("get fact") };
        let first = get(self.first.id.clone()).await.expect("the first fact stays");
        let second = get(self.second.id.clone()).await.expect("the second fact stays");
        let new = get(self.new.id.clone()).await;
        let all = PageRequest {
            limit: 100,
            cursor: None,
        };
        let audited = audited(store, scope, &self.audit).await;
        let decided = store
            .list_decisions(scope, None, &all)
            .await
            .expect("decisions")
            .items
            .iter()
            .any(|decision| decision.id == self.decision.id);
        let committed = new.is_some();
        let seen = (
            first.status,
            first.superseded_by.clone(),
            second.status,
            audited,
            decided,
        );
        let expected = if committed {
            (
                FactStatus::Superseded,
                Some(self.new.id.clone()),
                FactStatus::Retracted,
                true,
                true,
            )
        } else {
            (FactStatus::Active, None, FactStatus::Active, false, false)
        };
        assert_eq!(seen, expected, "committed: {committed}");
        committed
    }
}

async fn stores() -> Option<(Proxy, ClusterStore, ClusterStore, super::Indices)> {
    let (url, direct, cleanup) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await?;
    direct.bootstrap().await.expect("bootstrap");
    let proxy = Proxy::start(&url);
    let proxied = ClusterStore::connect(&proxy.url, direct.prefix(), 3)
        .await
        .expect("the proxy answers");
    proxied.bootstrap().await.expect("bootstrap through the proxy");
    Some((proxy, direct, proxied, cleanup))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_whole_after_a_failure_at_any_point() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    for mode in [Mode::Refuse, Mode::LoseAnswer] {
        let mut point = 0;
        let (mut committed_after_failure, mut rolled_back) = (0, 0);
        loop {
            let scope = cairn_store_tests::scope("acme", &format!("user-{mode:?}-{point}"));
            let world = World::seed(&direct, &scope).await;
            proxy.arm(point, mode);
            let result = proxied.commit(&scope, world.change_set()).await;
            let (fired, log) = proxy.disarm();
            direct.recover_commits(Duration::ZERO).await.expect("recovery");
            let committed = world.whole(&direct, &scope).await;
            assert_eq!(
                direct.recover_commits(Duration::ZERO).await.expect("again"),
                0,
                "recovery leaves no journal"
            );
            if !fired {
                result.expect("a commit without a fault succeeds");
                assert!(committed);
                eprintln!(
                    "{mode:?}: {point} failure points, {committed_after_failure} finished by recovery, \
                     {rolled_back} rolled back; requests: {log:#?}"
                );
                break;
            }
            let failed = log.get(point).map(String::as_str).unwrap_or_default();
            if failed.starts_with("DELETE") && failed.contains("-state/_doc/value%3A") {
                // The claim on the value, given back after the commit: left to expire.
                result.unwrap_or_else(|error| {
                    panic!("{mode:?}: a lost claim release failed the commit: {error}")
                });
                assert!(committed, "{mode:?}: committed before the claim was given back");
                committed_after_failure += 1;
                point += 1;
                continue;
            }
            assert!(
                matches!(result, Err(Error::Unavailable(_))),
                "{mode:?} at request {point} ({failed}): {result:?}"
            );
            if committed {
                committed_after_failure += 1;
            } else {
                rolled_back += 1;
            }
            point += 1;
        }
        // Reads, the journal, two updates, the commit point, the bulk, the cleanup.
        assert!(point >= 8, "{mode:?}: only {point} requests were tried");
        assert!(
            rolled_back > 0 && committed_after_failure > 0,
            "both outcomes are exercised"
        );
    }
}

/// The request lines of a clean commit of the tests' shape, in order, for a fresh
/// scope of `user`: which request is which, for arming a fault at one of them.
async fn rehearse(proxy: &Proxy, direct: &ClusterStore, proxied: &ClusterStore, user: &str) -> Vec<String> {
    let scope = cairn_store_tests::scope("acme", user);
    let world = World::seed(direct, &scope).await;
    proxy.arm(usize::MAX, Mode::Refuse);
    proxied
        .commit(&scope, world.change_set())
        .await
        .expect("rehearsal");
    proxy.disarm().1
}

/// Whether a request line is the commit point: the journal marked committed by
/// compare-and-set.
fn is_commit_point(line: &str) -> bool {
    line.contains("-commits/_doc/") && line.contains("if_seq_no")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_write_the_node_repeats_still_commits() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    let log = rehearse(&proxy, &direct, &proxied, "repeat-rehearsal").await;
    let journal_writes: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("-commits/_create/") || is_commit_point(line))
        .map(|(index, _)| index)
        .collect();
    assert_eq!(
        journal_writes.len(),
        2,
        "the journal is opened and marked committed: {log:#?}"
    );
    for (round, point) in journal_writes.into_iter().enumerate() {
        let scope = cairn_store_tests::scope("acme", &format!("repeat-{round}"));
        let world = World::seed(&direct, &scope).await;
        proxy.arm(point, Mode::Repeat);
        let result = proxied.commit(&scope, world.change_set()).await;
        let (fired, log) = proxy.disarm();
        assert!(fired, "request {point} was repeated");
        result.unwrap_or_else(|error| panic!("{} repeated: {error}", log[point]));
        assert!(world.whole(&direct, &scope).await, "committed");
        assert_eq!(
            direct.recover_commits(Duration::ZERO).await.expect("recovery"),
            0,
            "no journal is left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_takes_over_a_commit_stalled_before_its_commit_point() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    // A clean run of the same shape shows which request is the commit point.
    let log = rehearse(&proxy, &direct, &proxied, "rehearsal").await;
    let commit_point = log
        .iter()
        .position(|line| is_commit_point(line))
        .expect("the journal is marked committed by compare-and-set");

    let scope = cairn_store_tests::scope("acme", "alice");
    let world = World::seed(&direct, &scope).await;
    proxy.arm(commit_point, Mode::Hold);
    let stalled = {
        let (proxied, scope, change_set) = (proxied.clone(), scope.clone(), world.change_set());
        tokio::spawn(async move { proxied.commit(&scope, change_set).await })
    };
    let waiting = Arc::new(proxy);
    let holder = Arc::clone(&waiting);
    tokio::task::spawn_blocking(move || holder.wait_until_holding())
        .await
        .expect("held");
    // Both updates are made; the commit has not passed its commit point.
    let first = direct
        .get_fact(&scope, &world.first.id)
        .await
        .expect("get")
        .expect("present");
    assert_eq!(first.status, FactStatus::Superseded);
    assert_eq!(direct.recover_commits(Duration::ZERO).await.expect("recovery"), 1);
    waiting.release();
    let result = stalled.await.expect("task");
    assert!(matches!(result, Err(Error::Unavailable(_))), "{result:?}");
    assert!(!world.whole(&direct, &scope).await, "rolled back");
    waiting.disarm();
}

/// Whether the store holds all of an ingest (its episodes and its audit event) or none
/// of it; panics on a part. Returns which.
async fn ingest_whole(url: &str, store: &ClusterStore, scope: &Scope, change_set: &ChangeSet) -> bool {
    let mut present = Vec::new();
    for change in &change_set.changes {
        if let Change::InsertEpisodes(episodes) = change {
            for episode in episodes {
                present.push(
                    store
                        .get_episode(scope, &episode.id)
                        .await
                        .expect("get")
                        .is_some(),
                );
            }
        }
    }
    // Audit events are listed by a search, and an ingest does not refresh.
    super::operations::raw_json(url, "POST", &format!("/{}-audit/_refresh", store.prefix()))
        .await
        .expect("refresh the audit index");
    let mut audited_all = true;
    for event in &change_set.audit {
        audited_all &= audited(store, scope, event).await;
    }
    present.push(audited_all);
    assert!(
        present.iter().all(|&held| held) || present.iter().all(|&held| !held),
        "a part of the ingest is stored: {present:?}"
    );
    audited_all
}

/// Whether the scope's audit lists `event`.
async fn audited(store: &ClusterStore, scope: &Scope, event: &AuditEvent) -> bool {
    let all = PageRequest {
        limit: 100,
        cursor: None,
    };
    store
        .list_audit(scope, &all)
        .await
        .expect("audit")
        .items
        .iter()
        .any(|listed| listed.id == event.id)
}

/// An ingest's commit is one bulk that carries its journal. A failure at any request
/// leaves all of it or none after recovery, and a bulk the node never got, or whose
/// answer was lost, is made again the long way (journal, then bulk) and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_is_whole_after_a_failure_at_any_point() {
    let Some((proxy, direct, proxied, cleanup)) = stores().await else {
        return;
    };
    let url = cleanup.url();
    for mode in [Mode::Refuse, Mode::LoseAnswer] {
        let mut point = 0;
        let mut bulk_failures_retried = 0;
        loop {
            let scope = cairn_store_tests::scope("acme", &format!("ingest-{mode:?}-{point}"));
            let earlier = cairn_store_tests::session_episode("I moved to Lisbon in March.");
            direct
                .commit(&scope, cairn_store_tests::ingest(&scope, vec![earlier]))
                .await
                .expect("an earlier episode of the session");
            let episodes = ["My flat has a view of the river.", "I walk to work now."]
                .map(cairn_store_tests::session_episode)
                .to_vec();
            let change_set = cairn_store_tests::ingest(&scope, episodes);
            // The journals the last round retired are deleted now, not during this one.
            proxied
                .recover_commits(Duration::from_secs(3600))
                .await
                .expect("delete retired journals");
            proxy.arm(point, mode);
            let result = proxied.commit(&scope, change_set.clone()).await;
            let (fired, log) = proxy.disarm();
            direct.recover_commits(Duration::ZERO).await.expect("recovery");
            let committed = ingest_whole(&url, &direct, &scope, &change_set).await;
            if !fired {
                result.expect("an ingest without a fault succeeds");
                assert!(committed);
                let bulks = log.iter().filter(|line| line.contains("/_bulk")).count();
                let journals = log.iter().filter(|line| line.contains("-commits/")).count();
                assert_eq!(
                    (bulks, journals),
                    (1, 0),
                    "one bulk, its journal inside: {log:#?}"
                );
                break;
            }
            let failed = log.get(point).map(String::as_str).unwrap_or_default();
            match &result {
                Ok(()) => {
                    assert!(committed, "{mode:?} at {failed}: answered but not stored");
                    assert!(
                        failed.contains("/_bulk"),
                        "{mode:?}: only a failed bulk is made again: {failed}"
                    );
                    bulk_failures_retried += 1;
                }
                Err(Error::Unavailable(_)) => {}
                Err(error) => panic!("{mode:?} at request {point} ({failed}): {error}"),
            }
            point += 1;
        }
        assert!(point >= 3, "{mode:?}: only {point} requests were tried");
        assert!(
            bulk_failures_retried == 1,
            "{mode:?}: the failed bulk was made again"
        );
    }
}

/// Every document of the scope in every index but the audit trail and the scope's state
/// (its generation and position floor), after a refresh: `index/id` of each.
async fn left_in_scope(url: &str, store: &ClusterStore, scope: &Scope) -> Vec<String> {
    let prefix = store.prefix();
    super::operations::raw_json(url, "POST", &format!("/{prefix}-*/_refresh"))
        .await
        .expect("refresh");
    let body = serde_json::json!({
        "size": 100,
        "_source": false,
        "query": { "bool": {
            "filter": [
                { "term": { "tenant": scope.tenant().as_str() } },
                { "term": { "user": scope.user().as_str() } }
            ],
            "must_not": [ { "terms": { "_index": [format!("{prefix}-audit"), format!("{prefix}-state")] } } ]
        } }
    });
    let answer = super::operations::raw_json_body(url, "POST", &format!("/{prefix}-*/_search"), body)
        .await
        .expect("search every index");
    answer["hits"]["hits"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|hit| {
            format!(
                "{}/{}",
                hit["_index"].as_str().unwrap_or("?"),
                hit["_id"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// Runs `write` through the proxy with the first request holding `text` held, erases
/// the scope directly meanwhile, releases the request, and answers what `write` did.
async fn held_across_an_erasure<T: Send + 'static>(
    proxy: Proxy,
    direct: &ClusterStore,
    scope: &Scope,
    text: &str,
    write: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    proxy.arm_first(text, Mode::Hold);
    let written = tokio::spawn(write);
    let proxy = Arc::new(proxy);
    let holder = Arc::clone(&proxy);
    tokio::task::spawn_blocking(move || holder.wait_until_holding())
        .await
        .expect("held");
    let receipt = direct
        .erase_scope(scope, cairn_store_tests::audit(scope, "user.erase"))
        .await
        .expect("the erasure goes on while the write is held");
    assert!(
        receipt.facts + receipt.episodes > 0,
        "the erasure found the scope's memory: {receipt:?}"
    );
    proxy.release();
    let answer = written.await.expect("task");
    proxy.disarm();
    answer
}

fn is_scope_erased(result: &cairn_core::Result<()>) -> bool {
    matches!(result, Err(Error::Conflict { code, .. }) if code.as_str() == "scope_erased")
}

/// A commit held after its commit point (its inserts' bulk) while another process
/// erases the scope writes its inserts when released, sees the erasure, and takes them
/// back: nothing of the scope is left, and it answers `scope_erased`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_overtakes_a_commit_held_after_its_commit_point() {
    let Some((proxy, direct, proxied, cleanup)) = stores().await else {
        return;
    };
    let url = cleanup.url();
    let scope = cairn_store_tests::scope("acme", "held-commit");
    let world = World::seed(&direct, &scope).await;
    let result = {
        let (proxied, scope, change_set) = (proxied.clone(), scope.clone(), world.change_set());
        held_across_an_erasure(proxy, &direct, &scope.clone(), "/_bulk", async move {
            proxied.commit(&scope, change_set).await
        })
        .await
    };
    assert!(is_scope_erased(&result), "{result:?}");
    assert_eq!(left_in_scope(&url, &direct, &scope).await, Vec::<String>::new());
    assert_eq!(direct.recover_commits(Duration::ZERO).await.expect("recovery"), 0);
    assert!(
        direct
            .get_fact(&scope, &world.new.id)
            .await
            .expect("get")
            .is_none()
    );
}

/// An ingest held at its one bulk (positions reserved before the erasure) is taken
/// back the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_overtakes_an_ingest_held_at_its_bulk() {
    let Some((proxy, direct, proxied, cleanup)) = stores().await else {
        return;
    };
    let url = cleanup.url();
    let scope = cairn_store_tests::scope("acme", "held-ingest");
    let earlier = cairn_store_tests::session_episode("I moved to Lisbon in March.");
    direct
        .commit(&scope, cairn_store_tests::ingest(&scope, vec![earlier]))
        .await
        .expect("an earlier episode");
    let late = cairn_store_tests::session_episode("My flat has a view of the river.");
    let change_set = cairn_store_tests::ingest(&scope, vec![late.clone()]);
    let result = {
        let (proxied, scope) = (proxied.clone(), scope.clone());
        held_across_an_erasure(proxy, &direct, &scope.clone(), "/_bulk", async move {
            proxied.commit(&scope, change_set).await
        })
        .await
    };
    assert!(is_scope_erased(&result), "{result:?}");
    assert_eq!(left_in_scope(&url, &direct, &scope).await, Vec::<String>::new());
    assert!(direct.get_episode(&scope, &late.id).await.expect("get").is_none());
    // The next ingest is read by consolidation from the erased scope's floor.
    let next = cairn_store_tests::session_episode("I work from home now.");
    direct
        .commit(&scope, cairn_store_tests::ingest(&scope, vec![next.clone()]))
        .await
        .expect("an ingest after the erasure");
    let watermark = direct.watermark(&scope).await.expect("watermark");
    let log = direct.episodes_after(&scope, watermark, 10).await.expect("log");
    assert_eq!(
        log.iter()
            .map(|logged| logged.episode.id.clone())
            .collect::<Vec<_>>(),
        vec![next.id]
    );
}

/// A recovery that rolls a left-behind committed journal forward, held at its bulk
/// while the scope is erased, takes back what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_overtakes_a_recovery_held_at_its_roll_forward() {
    let Some((proxy, direct, proxied, cleanup)) = stores().await else {
        return;
    };
    let url = cleanup.url();
    let scope = cairn_store_tests::scope("acme", "held-recovery");
    let world = World::seed(&direct, &scope).await;
    // The commit passes its commit point and its bulk never reaches the node: a
    // committed journal is left for recovery.
    proxy.arm_first("/_bulk", Mode::Refuse);
    let failed = proxied.commit(&scope, world.change_set()).await;
    assert!(proxy.disarm().0, "the bulk was refused");
    assert!(matches!(failed, Err(Error::Unavailable(_))), "{failed:?}");
    let result = {
        let proxied = proxied.clone();
        held_across_an_erasure(proxy, &direct, &scope.clone(), "/_bulk", async move {
            proxied.recover_commits(Duration::ZERO).await.map(|_| ())
        })
        .await
    };
    result.expect("recovery ends");
    assert_eq!(left_in_scope(&url, &direct, &scope).await, Vec::<String>::new());
    assert_eq!(direct.recover_commits(Duration::ZERO).await.expect("recovery"), 0);
}

/// Runs `held` through the proxy with its first bulk held, then `racing` directly
/// while it is held; releases `held` a moment later and answers both outcomes.
async fn raced_while_held<T: Send + 'static>(
    proxy: Proxy,
    held: impl std::future::Future<Output = T> + Send + 'static,
    racing: impl std::future::Future<Output = T> + Send + 'static,
) -> (T, T) {
    proxy.arm_first("/_bulk", Mode::Hold);
    let first = tokio::spawn(held);
    let proxy = Arc::new(proxy);
    let holder = Arc::clone(&proxy);
    tokio::task::spawn_blocking(move || holder.wait_until_holding())
        .await
        .expect("held");
    let second = tokio::spawn(racing);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.release();
    let first = first.await.expect("task");
    let second = second.await.expect("task");
    proxy.disarm();
    (first, second)
}

fn unique_write(scope: &Scope, fact: &Fact) -> ChangeSet {
    ChangeSet::new(cairn_store_tests::audit(scope, "fact.create"))
        .with(Change::RequireNoActiveValue {
            fingerprint: cairn_core::text::fingerprint(&fact.text),
        })
        .with(Change::InsertFact(fact.clone()))
}

/// Two writes of one value on two processes, the first held at its bulk after its
/// check passed: the second waits for the first's claim on the value, then finds it
/// active and is a duplicate. One value, one active fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writes_of_one_value_on_two_processes_leave_one_active() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    let scope = cairn_store_tests::scope("acme", "one-value");
    let at = Utc::now();
    let first = cairn_store_tests::fact("The user plays the oboe", at);
    let second = cairn_store_tests::fact("the user plays the OBOE!", at);
    let (held, racing) = {
        let (proxied, direct, scope) = (proxied.clone(), direct.clone(), scope.clone());
        let (held, racing) = (unique_write(&scope, &first), unique_write(&scope, &second));
        let other = scope.clone();
        raced_while_held(
            proxy,
            async move { proxied.commit(&scope, held).await },
            async move { direct.commit(&other, racing).await },
        )
        .await
    };
    assert!(held.is_ok(), "{held:?}");
    assert!(
        matches!(&racing, Err(Error::Conflict { code, .. }) if code.as_str() == "duplicate"),
        "{racing:?}"
    );
    let active = direct
        .find_active_facts_by_fingerprint(&scope, &cairn_core::text::fingerprint(&first.text))
        .await
        .expect("read");
    assert_eq!(active.len(), 1, "{active:?}");
}

/// A value tombstoned on one process, its commit held at its bulk, while another
/// process inserts a fact with that value: the insert waits for the tombstone's claim,
/// then finds the tombstone and is refused. A forgotten value cannot come back through
/// a write that checked before the forget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_racing_a_tombstone_on_another_process_is_refused() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    let scope = cairn_store_tests::scope("acme", "tombstoned-value");
    let at = Utc::now();
    let returning = cairn_store_tests::fact("The user lives in Porto", at);
    let tombstone = cairn_core::Tombstone {
        id: cairn_core::new_id("tomb"),
        fingerprint: cairn_core::text::fingerprint(&returning.text),
        fact_id: cairn_core::new_id("fact"),
        reason: cairn_core::TombstoneReason::Forgotten,
        created_at: at,
        lifted_at: None,
    };
    let forget = ChangeSet::new(cairn_store_tests::audit(&scope, "fact.forget"))
        .with(Change::InsertTombstone(tombstone));
    let insert = ChangeSet::new(cairn_store_tests::audit(&scope, "consolidation.batch"))
        .with(Change::InsertFact(returning.clone()));
    let (held, racing) = {
        let (proxied, direct, scope) = (proxied.clone(), direct.clone(), scope.clone());
        let other = scope.clone();
        raced_while_held(
            proxy,
            async move { proxied.commit(&scope, forget).await },
            async move { direct.commit(&other, insert).await },
        )
        .await
    };
    assert!(held.is_ok(), "{held:?}");
    assert!(matches!(&racing, Err(Error::Tombstoned { .. })), "{racing:?}");
    assert!(
        direct
            .get_fact(&scope, &returning.id)
            .await
            .expect("get")
            .is_none(),
        "the forgotten value did not come back"
    );
}

/// A job released (after a failed run) while its lease is renewed on another
/// connection: the release's conditional write meets the renewal's newer version and
/// must read the job again and release it, not leave it leased. A job left leased is
/// not claimed until its renewed lease runs out, and a dead-lettered one is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_lease_renewal_still_releases_the_job() {
    let Some((proxy, direct, proxied, _cleanup)) = stores().await else {
        return;
    };
    let scope = cairn_store_tests::scope("acme", "released-job");
    let now = Utc::now();
    let queued = cairn_store_tests::job(&scope, now);
    direct
        .commit(
            &scope,
            ChangeSet::new(cairn_store_tests::audit(&scope, "episode.ingest"))
                .with(Change::EnqueueJob(queued.clone())),
        )
        .await
        .expect("enqueue");
    let lease = now + chrono::Duration::seconds(30);
    let (claimed_scope, claimed) = direct
        .claim_job(now, lease, None)
        .await
        .expect("claim")
        .expect("the job is due");
    assert_eq!(
        (claimed_scope, claimed.id.as_str()),
        (scope.clone(), queued.id.as_str())
    );

    // The release reads the job, then its write is held while the lease is renewed.
    proxy.arm_first(
        &format!("PUT /{}-jobs/_doc/{}", direct.prefix(), queued.id),
        Mode::Hold,
    );
    let released = {
        let (proxied, scope, id) = (proxied.clone(), scope.clone(), queued.id.clone());
        tokio::spawn(async move {
            proxied
                .release_job(&scope, &id, now, "provider keeps failing", true)
                .await
        })
    };
    let proxy = Arc::new(proxy);
    let holder = Arc::clone(&proxy);
    tokio::task::spawn_blocking(move || holder.wait_until_holding())
        .await
        .expect("held");
    assert!(
        direct
            .renew_job(&scope, &queued.id, now + chrono::Duration::minutes(10))
            .await
            .expect("renew"),
        "the lease is renewed while the release is held"
    );
    proxy.release();
    released.await.expect("task").expect("release");
    let (fired, _) = proxy.disarm();
    assert!(fired, "the release's write was held");

    let pending = direct.pending_jobs(&scope).await.expect("jobs");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].last_error.as_deref(), Some("provider keeps failing"));
    assert!(
        pending[0].dead_at.is_some(),
        "the job is dead-lettered: {pending:?}"
    );
    assert!(
        direct
            .claim_job(
                now + chrono::Duration::minutes(20),
                now + chrono::Duration::minutes(21),
                None
            )
            .await
            .expect("claim")
            .is_none(),
        "a dead-lettered job is not claimed again, even after the renewed lease ran out"
    );
}
