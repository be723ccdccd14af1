//! The search-cluster backend: OpenSearch 2.x/3.x and Elasticsearch 8/9, one index per
//! record kind (templates in `mappings/`), documents routed by tenant, every query
//! filtered by tenant and user (inside the kNN clause too).
//!
//! A cluster has no multi-document transactions: a change set is committed through a
//! journal that recovery rolls forward or back after any failure (see `commit`). A
//! commit that changes facts, playbooks, tombstones or jobs refreshes (`refresh=true`)
//! and is visible to the next recall; an ingest does not: its episodes are read by id,
//! consolidated and erased at once, and searchable within the refresh interval (see
//! ARCHITECTURE.md, "Refresh policy").

mod check;
mod client;
mod commit;
mod docs;
mod erasure;
mod gaps;
mod limits;
pub mod mappings;
pub mod query;
mod recalled;
mod records;
mod reserved;
mod statistics;
mod usage;
mod values;
mod vectors;

pub use client::{Access, Credentials, Engine};

use cairn_core::bm25::{self, ScopeStatistics};
use cairn_core::{
    AuditEvent, ChangeSet, ConsolidationJob, Decision, DecisionKind, Episode, ErasureReceipt, Error, Fact,
    FactStatus, LoggedEpisode, Memory, MemoryStore, Page, PageRequest, Playbook, Result, Review, ReviewKind,
    ReviewSummary, Scope, SearchFilter, StatusFilter, TenantId, TenantScope, TextHit, TextQuery, Tier,
    Tombstone, UseCount, UserId, UserSummary, VectorQuery,
};
use chrono::{DateTime, Utc};
use client::{Answer, Cluster, Method, failure};
use records::Hit;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Positions reserved this long ago are either indexed or lost: a gap whose reservation
/// is older no longer holds consolidation back (see `gaps`).
pub const DEFAULT_GAP_PATIENCE: Duration = Duration::from_secs(30);
/// State documents kept by [`ClusterStore::edit_state`].
const STATE_CACHE: usize = 10_000;
/// Sessions per scope whose latest episode the state document names.
const REMEMBERED_SESSIONS: usize = 64;
/// Routing of the store-wide documents (the embedding space).
const SYSTEM: &str = "_system";

/// The index kinds, each `<prefix>-<kind>`.
pub const INDICES: [&str; 13] = [
    "episodes",
    "facts",
    "playbooks",
    "playbook-versions",
    "edges",
    "tombstones",
    "decisions",
    "audit",
    "state",
    "usage",
    "jobs",
    "commits",
    "reviews",
];

#[derive(Clone)]
pub struct ClusterStore {
    cluster: Cluster,
    engine: Engine,
    version: Arc<RwLock<String>>,
    prefix: String,
    dimension: usize,
    status: Arc<RwLock<Status>>,
    /// Replicas per index; `None`: chosen from the number of data nodes.
    replicas: Option<u32>,
    /// How long a reserved position may stay unwritten before consolidation passes it.
    gap_patience: Duration,
    /// The cluster health the last ping saw, when it was not green.
    degraded: Arc<RwLock<Option<String>>>,
    /// The state documents this process last wrote, by scope: the first attempt of a
    /// state change writes on them without reading (compare-and-set still decides).
    states: Arc<std::sync::Mutex<HashMap<String, Versioned>>>,
    /// Journals of finished ingests, deleted later in one go (see `commit`).
    retired: Arc<commit::Retired>,
    /// Ingests readied while their episodes were embedded (see `commit::Prepared`).
    prepared: Arc<commit::Prepared>,
    /// The episode each recent session ended with, as written (see `commit::Tails`).
    tails: Arc<commit::Tails>,
    /// The episode ids of positions this process reserved (see `reserved`).
    reserved: Arc<reserved::Reserved>,
    /// The scope statistics text searches counted, kept a while (see `statistics`).
    statistics: Arc<statistics::StatisticsCache>,
}

/// Whether the indices are known to be in place: reads and writes wait for it.
#[derive(Clone, Debug)]
enum Status {
    /// Not bootstrapped yet (the cluster may be down); the reason is reported.
    Pending(String),
    Ready,
    /// Bootstrap found indices it must not write into.
    Refused(String),
}

/// Readies a document on its way to the cluster: the `embedding` its `vector` holds
/// (see `vectors`) and, in an index of records, its `record` made afresh (see
/// `recalled`).
fn outgoing(document: &mut Value, holds_records: bool) -> Result<()> {
    vectors::indexable(document)?;
    if holds_records {
        recalled::attach(document)?;
    }
    Ok(())
}

/// Whether a job document is due at `now` (micros) and not leased, as
/// [`query::due_jobs`] selects it.
fn due_at(job: &Value, now: i64) -> bool {
    job["run_after"].as_i64().is_some_and(|at| at <= now)
        && job["leased_until"].as_i64().is_none_or(|until| until <= now)
        && job.get("dead_at").is_none_or(Value::is_null)
}

/// Percent-encodes an id for a URL path segment.
fn segment(id: &str) -> String {
    let mut out = String::new();
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn refresh() -> (&'static str, String) {
    ("refresh", "true".to_owned())
}

fn state_id(scope: &Scope) -> String {
    format!("{}/{}", scope.tenant(), scope.user())
}

/// The id of a scope's consolidation watermark: a document of its own in the state
/// index, beside the state document that ingests write (episode positions, sessions),
/// so that a consolidation run and an ingest never write the same document.
fn watermark_id(scope: &Scope) -> String {
    format!("{}#watermark", state_id(scope))
}

/// The id of the lease on a scope's consolidation runs, in the state index beside the
/// scope's state and watermark (one run per scope across processes).
fn runs_id(scope: &Scope) -> String {
    format!("{}#runs", state_id(scope))
}

/// The watermark document of a scope at `position`.
fn watermark_source(scope: &Scope, position: u64) -> Value {
    json!({ "tenant": scope.tenant().as_str(), "user": scope.user().as_str(),
            "id": watermark_id(scope), "watermark": position })
}

/// A document read for a conditional write.
struct Versioned {
    source: Value,
    seq_no: i64,
    primary_term: i64,
}

/// A conditional update planned in the check step.
struct Update {
    index: &'static str,
    id: String,
    /// The document as read (`None`: it did not exist yet).
    before: Option<Versioned>,
    after: Value,
    /// A counter increment, which commutes: a conflict on it retries the commit.
    commutative: bool,
}

impl Update {
    /// An update that conflicts with any concurrent change of its document.
    fn new(index: &'static str, id: String, before: Option<Versioned>, after: Value) -> Self {
        Update {
            index,
            id,
            before,
            after,
            commutative: false,
        }
    }
}

/// Indices whose documents are only ever read by id (and searched only by erasure,
/// which refreshes first): their writes need no refresh.
const READ_BY_ID: [&str; 3] = ["state", "usage", "commits"];

/// Documents read per request by whole-set reads (`scoped_all`).
const PAGE: usize = 500;

/// The result of each item of a bulk answer (`{"_id", "status", "error"?, ...}`).
fn bulk_results(answer: &Value) -> impl Iterator<Item = &Value> {
    answer["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item.as_object()?.values().next())
}

fn cursor_of(hit: &Hit) -> Option<String> {
    let sort = hit.sort.as_ref()?.as_array()?;
    Some(format!("{}:{}", sort.first()?.as_i64()?, sort.get(1)?.as_str()?))
}

fn parse_cursor(page: &PageRequest) -> Result<Option<(i64, String)>> {
    match &page.cursor {
        None => Ok(None),
        Some(cursor) => cursor
            .split_once(':')
            .and_then(|(time, id)| Some((time.parse::<i64>().ok()?, id.to_owned())))
            .map(Some)
            .ok_or_else(|| Error::invalid("cursor", "is not a cursor this service issued")),
    }
}

impl ClusterStore {
    /// A store for the cluster at `url` speaking `engine`, without contacting it: reads
    /// and writes answer `Unavailable` until [`ClusterStore::bootstrap`] has succeeded.
    pub fn new(url: &str, engine: Engine, prefix: &str, dimension: usize) -> Result<Self> {
        ClusterStore::with_access(url, &Access::default(), engine, prefix, dimension)
    }

    /// [`ClusterStore::new`] with credentials and TLS settings.
    pub fn with_access(
        url: &str,
        access: &Access,
        engine: Engine,
        prefix: &str,
        dimension: usize,
    ) -> Result<Self> {
        Ok(ClusterStore {
            cluster: Cluster::with_access(url, access, Duration::from_secs(30))?,
            engine,
            version: Arc::new(RwLock::new(String::new())),
            prefix: prefix.to_owned(),
            dimension,
            status: Arc::new(RwLock::new(Status::Pending(
                "the search cluster has not been reached yet".into(),
            ))),
            replicas: None,
            gap_patience: DEFAULT_GAP_PATIENCE,
            degraded: Arc::new(RwLock::new(None)),
            states: Arc::default(),
            retired: Arc::default(),
            prepared: Arc::default(),
            tails: Arc::default(),
            reserved: Arc::default(),
            statistics: Arc::default(),
        })
    }

    /// Connects and detects the engine and version (the local node's info). Indices are not touched:
    /// `bootstrap` installs them.
    pub async fn connect(url: &str, prefix: &str, dimension: usize) -> Result<Self> {
        ClusterStore::connect_with(url, &Access::default(), prefix, dimension).await
    }

    /// [`ClusterStore::connect`] with credentials and TLS settings.
    pub async fn connect_with(url: &str, access: &Access, prefix: &str, dimension: usize) -> Result<Self> {
        let probe = Cluster::with_access(url, access, Duration::from_secs(30))?;
        let (engine, version) = probe.detect().await?;
        let store = ClusterStore::with_access(url, access, engine, prefix, dimension)?;
        if let Ok(mut slot) = store.version.write() {
            *slot = version;
        }
        Ok(store)
    }

    /// Sets the replicas of every index (`None`: 1 on several data nodes, 0 on one).
    pub fn with_replicas(mut self, replicas: Option<u32>) -> Self {
        self.replicas = replicas;
        self
    }

    /// Sets how long a reserved episode position may stay unwritten before consolidation
    /// takes it for abandoned and reads past it (see `gaps`).
    pub fn with_gap_patience(mut self, patience: Duration) -> Self {
        self.gap_patience = patience;
        self
    }

    /// Microseconds before which a reservation is old enough to pass (see `gaps`).
    fn gap_cutoff(&self) -> i64 {
        docs::micros(Utc::now()) - self.gap_patience_micros()
    }

    fn gap_patience_micros(&self) -> i64 {
        i64::try_from(self.gap_patience.as_micros()).unwrap_or(i64::MAX)
    }

    fn ready(&self) -> Result<()> {
        let status = self
            .status
            .read()
            .map_err(|_| Error::Storage("store status lock poisoned".into()))?;
        match &*status {
            Status::Ready => Ok(()),
            Status::Pending(reason) | Status::Refused(reason) => Err(Error::Unavailable(reason.clone())),
        }
    }

    /// Why the store refuses every read and write for good (indices it must not write
    /// into, another engine, another embedding model), if it does.
    pub fn refusal(&self) -> Option<String> {
        match &*self.status.read().ok()? {
            Status::Refused(reason) => Some(reason.clone()),
            Status::Pending(_) | Status::Ready => None,
        }
    }

    fn set_status(&self, status: Status) {
        if let Ok(mut slot) = self.status.write() {
            *slot = status;
        }
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The engine version seen at the last bootstrap.
    pub fn version(&self) -> String {
        self.version
            .read()
            .map(|version| version.clone())
            .unwrap_or_default()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn index(&self, kind: &str) -> String {
        format!("{}-{kind}", self.prefix)
    }

    /// Whether `index` is one of the indices whose documents carry a `record`.
    fn holds_records(&self, index: &str) -> bool {
        index
            .strip_prefix(self.prefix.as_str())
            .and_then(|kind| kind.strip_prefix('-'))
            .is_some_and(|kind| recalled::KINDS.contains(&kind))
    }

    /// Checks the engine (the local node's info), installs the index templates and creates missing
    /// indices; then reads and writes are allowed. An existing index whose mapping
    /// disagrees with the template is reported by name, left untouched, and the store
    /// refuses to read or write until it is fixed.
    pub async fn bootstrap(&self) -> Result<mappings::BootstrapReport> {
        self.bootstrap_claiming(None).await
    }

    /// [`ClusterStore::bootstrap`] for a service embedding with `space` (model id and
    /// dimension): the store claims it before it allows any read or write, and refuses
    /// every one, saying why, when the stored vectors belong to another model. A
    /// service that served first and checked after could mix another model's vectors
    /// into the kNN index, or answer recall with vectors that do not compare.
    pub async fn bootstrap_claiming(
        &self,
        space: Option<(&str, usize)>,
    ) -> Result<mappings::BootstrapReport> {
        let (engine, version) = match self.cluster.detect().await {
            Ok(found) => found,
            Err(error) => {
                self.set_status(Status::Pending(error.detail()));
                return Err(error);
            }
        };
        if engine != self.engine {
            let message = format!(
                "the cluster is {} {version}, but the backend is configured as {}",
                engine.as_str(),
                self.engine.as_str()
            );
            self.set_status(Status::Refused(message.clone()));
            return Err(Error::Unavailable(message));
        }
        if let Ok(mut slot) = self.version.write() {
            *slot = version.clone();
        }
        let target = mappings::Target {
            engine: self.engine,
            version: &version,
            prefix: &self.prefix,
            dimension: self.dimension,
            replicas: self.replicas,
        };
        match mappings::bootstrap(&self.cluster, &target).await {
            Ok(report) => {
                if let Some((model_id, dimension)) = space {
                    match self.claim_space(model_id, dimension).await {
                        Ok(()) => {}
                        Err(error @ Error::Unavailable(_)) => {
                            self.set_status(Status::Refused(error.detail()));
                            return Err(error);
                        }
                        Err(error) => {
                            self.set_status(Status::Pending(error.detail()));
                            return Err(error);
                        }
                    }
                }
                self.set_status(Status::Ready);
                Ok(report)
            }
            Err(error @ Error::Conflict { .. }) => {
                self.set_status(Status::Refused(error.to_string()));
                Err(error)
            }
            Err(error) => {
                self.set_status(Status::Pending(error.detail()));
                Err(error)
            }
        }
    }

    /// Records the embedding space on first use; `Unavailable`, naming both, when the
    /// store holds another model's vectors.
    async fn claim_space(&self, model_id: &str, dimension: usize) -> Result<()> {
        let body = json!({ "id": "embedding-space", "model_id": model_id, "dimension": dimension });
        let answer = self
            .write_if("state", "embedding-space", SYSTEM, body, None)
            .await?;
        if answer.ok() {
            return Ok(());
        }
        let recorded = self
            .get("state", "embedding-space", SYSTEM)
            .await?
            .ok_or_else(|| Error::Storage("embedding space vanished".into()))?;
        let stored_model = recorded.source["model_id"].as_str().unwrap_or_default();
        let stored_dimension = recorded.source["dimension"].as_u64().unwrap_or(0);
        if stored_model == model_id && stored_dimension == dimension as u64 {
            Ok(())
        } else {
            Err(Error::Unavailable(format!(
                "the store holds vectors of {stored_model}/{stored_dimension} but the configured embedding model is \
                 {model_id}/{dimension}; use the model the data was written with, or a new index prefix"
            )))
        }
    }

    /// Deletes every index and index template of this prefix (for tests).
    pub async fn delete_indices(&self) -> Result<()> {
        for kind in INDICES {
            for path in [
                format!("/{}", self.index(kind)),
                format!("/_index_template/{}", self.index(kind)),
            ] {
                let answer = self.cluster.call(Method::Delete, &path, &[], None).await?;
                if !answer.ok() && answer.status != 404 {
                    return Err(failure(&path, &answer));
                }
            }
        }
        Ok(())
    }

    async fn get(&self, kind: &str, id: &str, routing_key: &str) -> Result<Option<Versioned>> {
        let path = format!("/{}/_doc/{}", self.index(kind), segment(id));
        let answer = self
            .cluster
            .call(Method::Get, &path, &[("routing", routing_key.to_owned())], None)
            .await?;
        if answer.status == 404 {
            return Ok(None);
        }
        if !answer.ok() {
            return Err(failure(&path, &answer));
        }
        let hit: Hit = records::parse(&path, &answer.body)?;
        if hit.found != Some(true) {
            return Ok(None);
        }
        let (seq_no, primary_term) = hit.version()?;
        Ok(Some(Versioned {
            source: hit.source,
            seq_no,
            primary_term,
        }))
    }

    /// Changes a document of the scope by compare-and-set, read again after each
    /// conflict (a lease renewal, recall's use counting): `change` edits its source, or
    /// answers `false` to leave it as it is. `false` when the document is gone or was
    /// left as it was.
    async fn change_owned(
        &self,
        scope: &Scope,
        kind: &str,
        id: &str,
        change: impl Fn(&mut Value) -> bool,
    ) -> Result<bool> {
        self.ready()?;
        for _ in 0..10 {
            let Some(doc) = self.owned(scope, kind, id).await? else {
                return Ok(false);
            };
            let mut source = doc.source.clone();
            if !change(&mut source) {
                return Ok(false);
            }
            let answer = self
                .write_if(
                    kind,
                    id,
                    scope.tenant().as_str(),
                    source,
                    Some((doc.seq_no, doc.primary_term)),
                )
                .await?;
            if answer.status != 409 {
                return Ok(true);
            }
        }
        Err(Error::Unavailable(format!("{kind} {id}: too much contention")))
    }

    /// The document if it exists and belongs to the scope.
    async fn owned(&self, scope: &Scope, kind: &str, id: &str) -> Result<Option<Versioned>> {
        Ok(self
            .get(kind, id, scope.tenant().as_str())
            .await?
            .filter(|doc| docs::in_scope(scope, &doc.source)))
    }

    /// Creates a document; an existing one with the same id is left as it is (a replay).
    async fn create(&self, kind: &str, id: &str, routing_key: &str, body: Value) -> Result<()> {
        self.write_if(kind, id, routing_key, body, None).await.map(|_| ())
    }

    /// Writes a document only if it is still at the version read (`None`: only if absent).
    async fn write_if(
        &self,
        kind: &str,
        id: &str,
        routing_key: &str,
        body: Value,
        version: Option<(i64, i64)>,
    ) -> Result<Answer> {
        self.put(kind, id, routing_key, body, version, true).await
    }

    /// [`ClusterStore::write_if`], refreshing the index or not (the commit journal is
    /// read by id, which needs no refresh). Writes to indices only ever read by id (a
    /// get is realtime) never refresh.
    async fn put(
        &self,
        kind: &str,
        id: &str,
        routing_key: &str,
        mut body: Value,
        version: Option<(i64, i64)>,
        refreshed: bool,
    ) -> Result<Answer> {
        outgoing(&mut body, recalled::KINDS.contains(&kind))?;
        let index = self.index(kind);
        let mut query = vec![("routing", routing_key.to_owned())];
        if refreshed && !READ_BY_ID.contains(&kind) {
            query.push(refresh());
        }
        let path = match version {
            Some((seq_no, primary_term)) => {
                query.push(("if_seq_no", seq_no.to_string()));
                query.push(("if_primary_term", primary_term.to_string()));
                format!("/{index}/_doc/{}", segment(id))
            }
            None => format!("/{index}/_create/{}", segment(id)),
        };
        let answer = self.cluster.call(Method::Put, &path, &query, Some(body)).await?;
        if answer.ok() || answer.status == 409 {
            Ok(answer)
        } else {
            Err(failure(&path, &answer))
        }
    }

    async fn delete(&self, kind: &str, id: &str, routing_key: &str) -> Result<bool> {
        self.delete_doc(kind, id, routing_key, None, true).await
    }

    /// Deletes a document (only at `version`, when given); `false` when it was not
    /// there or had changed.
    async fn delete_doc(
        &self,
        kind: &str,
        id: &str,
        routing_key: &str,
        version: Option<(i64, i64)>,
        refreshed: bool,
    ) -> Result<bool> {
        let path = format!("/{}/_doc/{}", self.index(kind), segment(id));
        let mut query = vec![("routing", routing_key.to_owned())];
        if refreshed {
            query.push(refresh());
        }
        if let Some((seq_no, primary_term)) = version {
            query.push(("if_seq_no", seq_no.to_string()));
            query.push(("if_primary_term", primary_term.to_string()));
        }
        let answer = self.cluster.call(Method::Delete, &path, &query, None).await?;
        match answer.status {
            200..=299 => Ok(true),
            404 | 409 => Ok(false),
            _ => Err(failure(&path, &answer)),
        }
    }

    /// Makes everything written to the indices of `kinds` so far visible to searches.
    async fn refresh_indices(&self, kinds: &[&str]) -> Result<()> {
        let indices: Vec<String> = kinds.iter().map(|kind| self.index(kind)).collect();
        let path = format!("/{}/_refresh", indices.join(","));
        self.cluster
            .expect(Method::Post, &path, &[], None)
            .await
            .map(|_| ())
    }

    /// The documents of one index kind with `ids`, in the order asked: each `Some` when
    /// it exists and belongs to the scope. One multi-get, reading only `fields` when
    /// given; `realtime` as the get API has it (a realtime read of a document written
    /// since the last refresh makes the node refresh first).
    async fn scoped_multi_get(
        &self,
        scope: &Scope,
        kind: &str,
        ids: &[&str],
        fields: Option<&[&str]>,
        realtime: bool,
    ) -> Result<Vec<Option<Hit>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut query = vec![
            ("routing", scope.tenant().as_str().to_owned()),
            ("realtime", realtime.to_string()),
        ];
        if let Some(fields) = fields {
            query.push(("_source_includes", fields.join(",")));
        }
        let path = format!("/{}/_mget", self.index(kind));
        let answer = self
            .cluster
            .expect(Method::Post, &path, &query, Some(json!({ "ids": ids })))
            .await?;
        let hits: Vec<Hit> = records::parse("multi-get answer docs", &answer["docs"])?;
        if hits.len() != ids.len() {
            return Err(Error::Storage(format!(
                "{path}: {} answers to {} ids",
                hits.len(),
                ids.len()
            )));
        }
        Ok(hits
            .into_iter()
            .map(|hit| (hit.found == Some(true) && docs::in_scope(scope, &hit.source)).then_some(hit))
            .collect())
    }

    async fn search(&self, kind: &str, routing_key: Option<&str>, body: Value) -> Result<Value> {
        self.search_in(&self.index(kind), routing_key, body).await
    }

    /// A search over `indices` (full names, comma-separated).
    async fn search_in(&self, indices: &str, routing_key: Option<&str>, body: Value) -> Result<Value> {
        let path = format!("/{indices}/_search");
        let query: Vec<(&str, String)> = routing_key
            .map(|key| vec![("routing", key.to_owned())])
            .unwrap_or_default();
        self.cluster.expect(Method::Post, &path, &query, Some(body)).await
    }

    /// Every document of the scope matching `body`'s query, in its sort order (which must
    /// end in a unique field), read a page of `body`'s size at a time: never cut short.
    async fn scoped_all(&self, scope: &Scope, kind: &str, mut body: Value) -> Result<Vec<Hit>> {
        let size = body["size"].as_u64().unwrap_or(0) as usize;
        let mut all = Vec::new();
        loop {
            let found = self.scoped_search(scope, kind, body.clone()).await?;
            let next = found
                .last()
                .and_then(|hit| hit.sort.clone())
                .filter(|sort| sort.is_array() && found.len() == size && size > 0);
            all.extend(found);
            match next {
                Some(after) => body["search_after"] = after,
                None => return Ok(all),
            }
        }
    }

    /// Searches of one scope sent together in one `_msearch`, each `(kind, body)` and
    /// routed by the scope's tenant: the answer of each, in order.
    async fn scoped_searches(&self, scope: &Scope, searches: Vec<(&str, Value)>) -> Result<Vec<Value>> {
        if searches.is_empty() {
            return Ok(Vec::new());
        }
        let routing = scope.tenant().as_str();
        let mut body = String::new();
        let mut indices = Vec::with_capacity(searches.len());
        for (kind, search) in searches {
            let index = self.index(kind);
            body.push_str(&json!({ "index": index, "routing": routing }).to_string());
            body.push('\n');
            body.push_str(&search.to_string());
            body.push('\n');
            indices.push(index);
        }
        self.cluster.msearch(body, &indices).await
    }

    async fn scoped_search(&self, scope: &Scope, kind: &str, body: Value) -> Result<Vec<Hit>> {
        records::hits(&self.search(kind, Some(scope.tenant().as_str()), body).await?)
    }

    /// Sends bulk lines (action, source pairs) with `refresh=true`; an item error fails
    /// the call unless its status is one of `tolerated` (409: a replayed create; 404: an
    /// update of a document that is not there).
    async fn bulk(&self, lines: Vec<Value>, tolerated: &[u64]) -> Result<Value> {
        self.bulk_with(lines, tolerated, true).await
    }

    /// [`ClusterStore::bulk`], refreshing or not (use counts need not be searchable at
    /// once, and a refresh per flush would cost every recall its caches).
    async fn bulk_with(&self, mut lines: Vec<Value>, tolerated: &[u64], refreshed: bool) -> Result<Value> {
        if lines.is_empty() {
            return Ok(Value::Null);
        }
        let mut body = String::new();
        // Whether the line is the document of an index or create into an index of
        // records (an update's line is a partial document: none is sent to those).
        let mut record_next = false;
        for line in &mut lines {
            outgoing(line, record_next)?;
            if record_next {
                record_next = false;
            } else if let Some(action) = line.get("index").or_else(|| line.get("create")) {
                record_next = action["_index"]
                    .as_str()
                    .is_some_and(|index| self.holds_records(index));
            }
            body.push_str(&line.to_string());
            body.push('\n');
        }
        let answer = self.cluster.bulk(body, refreshed).await?;
        if answer["errors"] == true {
            let failed = bulk_results(&answer).find(|result| {
                !result["error"].is_null()
                    && !result["status"]
                        .as_u64()
                        .is_some_and(|status| tolerated.contains(&status))
            });
            if let Some(result) = failed {
                let message = format!("bulk write: {}", result["error"]);
                let status = result["status"]
                    .as_u64()
                    .and_then(|status| u16::try_from(status).ok());
                // An item failed for a shard on the move, like a whole request, is worth
                // retrying; what was written stays for recovery to finish.
                return Err(
                    if status.is_some_and(|status| client::transient(status, &result["error"])) {
                        Error::Unavailable(message)
                    } else {
                        Error::Storage(message)
                    },
                );
            }
        }
        Ok(answer)
    }

    async fn page<T>(
        &self,
        scope: &Scope,
        kind: &str,
        extra: Vec<Value>,
        sort_field: &str,
        page: &PageRequest,
        read: fn(&Value) -> Result<T>,
    ) -> Result<Page<T>> {
        let cursor = parse_cursor(page)?;
        let limit = page.limit.max(1);
        let body = query::listing(
            scope,
            extra,
            sort_field,
            limit + 1,
            cursor.as_ref().map(|(time, id)| (*time, id.as_str())),
        );
        let found = self.scoped_search(scope, kind, body).await?;
        let mut items = Vec::new();
        let mut next_cursor = None;
        for (index, hit) in found.iter().enumerate() {
            if index == limit {
                next_cursor = found.get(index - 1).and_then(cursor_of);
                break;
            }
            items.push(read(&hit.source)?);
        }
        Ok(Page { items, next_cursor })
    }

    /// A page of pending reviews, oldest first, by `body` (a review queue query of
    /// `tenant`) after the page's cursor. Review documents are written with a refresh (a
    /// commit that inserts one refreshes), so a held outcome is in the queue when its
    /// commit answers.
    async fn review_page(
        &self,
        tenant: &str,
        page: &PageRequest,
        body: impl FnOnce(usize, Option<(i64, &str)>) -> Value,
    ) -> Result<Page<cairn_core::UserReview>> {
        let after = page
            .cursor
            .as_deref()
            .map(cairn_core::parse_review_cursor)
            .transpose()?;
        let limit = page.limit.max(1);
        let body = body(limit + 1, after.as_ref().map(|(time, id)| (*time, id.as_str())));
        let answer = self.search("reviews", Some(tenant), body).await?;
        let mut items = records::hits(&answer)?
            .iter()
            .map(|hit| {
                let owner: records::Owner = records::parse("review", &hit.source)?;
                Ok(cairn_core::UserReview {
                    user: owner.user,
                    review: records::read_review(&hit.source)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|item| cairn_core::review_cursor(&item.review))
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    async fn state(&self, scope: &Scope) -> Result<Option<Versioned>> {
        self.get("state", &state_id(scope), scope.tenant().as_str()).await
    }

    /// The scope's consolidation watermark, with its document (see [`watermark_id`]).
    /// A store written before the watermark had a document of its own keeps it in the
    /// state document, which counts until the first move writes the watermark's own.
    async fn watermark_doc(&self, scope: &Scope) -> Result<(u64, Option<Versioned>)> {
        let tenant = scope.tenant().as_str();
        if let Some(doc) = self.get("state", &watermark_id(scope), tenant).await? {
            let position = doc.source["watermark"].as_u64().unwrap_or(0);
            return Ok((position, Some(doc)));
        }
        let earlier = self
            .state(scope)
            .await?
            .and_then(|doc| doc.source["watermark"].as_u64())
            .unwrap_or(0);
        Ok((earlier, None))
    }

    /// Changes the scope's state document by compare-and-set, retried on conflict.
    /// `edit` gets the current document (a fresh one when the scope has none) and says
    /// what to answer: after editing it (`Write`), or with nothing to write (`Keep`).
    async fn edit_state<T>(
        &self,
        scope: &Scope,
        what: &str,
        mut edit: impl FnMut(&mut Value) -> Result<StateEdit<T>>,
    ) -> Result<T> {
        let id = state_id(scope);
        let mut cached = self.states.lock().ok().and_then(|mut states| states.remove(&id));
        for _ in 0..50 {
            let from_cache = cached.is_some();
            let current = match cached.take() {
                Some(doc) => Some(doc),
                None => self.state(scope).await?,
            };
            let (mut state, version) = match current {
                Some(doc) => (doc.source, Some((doc.seq_no, doc.primary_term))),
                None => (fresh_state(scope), None),
            };
            let edited = match edit(&mut state) {
                // The cache may be behind another process's write: decide on a fresh read.
                Err(_) if from_cache => continue,
                edited => edited?,
            };
            let answer = match edited {
                // An answer without a write comes from a fresh read, never the cache.
                StateEdit::Keep(_) if from_cache => continue,
                StateEdit::Keep(answer) => return Ok(answer),
                StateEdit::Write(answer) => answer,
            };
            let written = self
                .write_if("state", &id, scope.tenant().as_str(), state.clone(), version)
                .await?;
            if written.ok() {
                if let Ok((seq_no, primary_term)) = records::written_version(&written.body)
                    && let Ok(mut states) = self.states.lock()
                {
                    // Bounded: a process serving many scopes starts over now and then.
                    if states.len() >= STATE_CACHE {
                        states.clear();
                    }
                    states.insert(
                        id,
                        Versioned {
                            source: state,
                            seq_no,
                            primary_term,
                        },
                    );
                }
                return Ok(answer);
            }
        }
        Err(Error::Unavailable(format!("{what}: too much contention")))
    }

    /// Reserves positions for `episodes` in the scope's episode log, and notes the last
    /// of them in each session (see [`Reservation`]). The ids are remembered by
    /// position (see `reserved`).
    async fn allocate_positions(
        &self,
        scope: &Scope,
        episodes: &[cairn_core::Episode],
    ) -> Result<Reservation> {
        let reservation = self.reserve_in_state(scope, episodes).await?;
        let ids = episodes.iter().map(|episode| episode.id.as_str());
        self.reserved.record(&state_id(scope), reservation.first, ids);
        Ok(reservation)
    }

    /// The compare-and-set of [`ClusterStore::allocate_positions`] on the state document.
    /// A scope being erased refuses it (`scope_erased`).
    async fn reserve_in_state(&self, scope: &Scope, episodes: &[cairn_core::Episode]) -> Result<Reservation> {
        let count = episodes.len() as u64;
        let now = docs::micros(Utc::now());
        let cutoff = now - self.gap_patience_micros();
        self.edit_state(scope, "episode positions", |state| {
            if erasure::erasing(state) {
                return Err(Error::scope_erased());
            }
            let generation = erasure::generation_of(state);
            let first = state["allocated"].as_u64().unwrap_or(0) + 1;
            // Noted before `allocated` moves: a state kept before reservations had
            // entries counts its positions so far as reserved at its `allocated_at`.
            gaps::Reservations::record(state, first + count - 1, now, cutoff);
            state["allocated"] = json!(first + count - 1);
            state["allocated_at"] = json!(now);
            let mut sessions = match state["sessions"].take() {
                Value::Object(sessions) => sessions,
                _ => serde_json::Map::new(),
            };
            let mut previous = HashMap::new();
            for episode in episodes {
                let Some(session) = episode.session_id.as_deref() else {
                    continue;
                };
                if let Some(last) = sessions.get(session).and_then(|known| known["last"].as_str()) {
                    previous
                        .entry(session.to_owned())
                        .or_insert_with(|| last.to_owned());
                }
                sessions.insert(session.to_owned(), json!({ "last": episode.id, "at": now }));
            }
            // The most recent sessions only; an older one is found by a search.
            while sessions.len() > REMEMBERED_SESSIONS {
                let oldest = sessions
                    .iter()
                    .min_by_key(|(_, known)| known["at"].as_i64().unwrap_or(0))
                    .map(|(session, _)| session.clone());
                match oldest {
                    Some(session) => sessions.remove(&session),
                    None => break,
                };
            }
            state["sessions"] = Value::Object(sessions);
            Ok(StateEdit::Write(Reservation {
                first,
                previous,
                generation,
            }))
        })
        .await
    }

    /// The episodes at the positions after `position` (up to `last`, at most `limit`)
    /// when this process reserved them all, read by id (see `reserved`): those found,
    /// in the scope and at their positions, up to the first that is not. `None` when
    /// the positions were not all reserved here or the first is not found.
    async fn reserved_episodes(
        &self,
        scope: &Scope,
        position: u64,
        last: u64,
        limit: usize,
    ) -> Result<Option<Vec<LoggedEpisode>>> {
        let last = last.min(position.saturating_add(limit as u64));
        if last <= position {
            return Ok(None);
        }
        let Some(ids) = self.reserved.ids(&state_id(scope), position + 1, last) else {
            return Ok(None);
        };
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let found = self.scoped_multi_get(scope, "episodes", &ids, None, true).await?;
        let mut episodes = Vec::new();
        for (expected, hit) in (position + 1..).zip(found) {
            let Some(hit) = hit else { break };
            let (at, episode) = records::read_episode(&hit.source)?;
            if at != expected {
                break;
            }
            episodes.push(LoggedEpisode {
                position: at,
                episode,
            });
        }
        Ok((!episodes.is_empty()).then_some(episodes))
    }

    /// Leases a job found due at `version`, counting an attempt: a compare-and-set
    /// without a refresh. A search that has not seen a lease yet offers the job at its
    /// version before the lease, whose write then conflicts; the job is read again by id
    /// (realtime) and leased at its current version if it is still due. Answers the
    /// attempts counted, or `None` when another worker holds it.
    async fn lease(
        &self,
        id: &str,
        tenant: &str,
        version: (i64, i64),
        source: Value,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
    ) -> Result<Option<u32>> {
        let leased = |mut source: Value, version: (i64, i64)| async move {
            source["leased_until"] = json!(docs::micros(lease_until));
            // The claim counts the attempt: a run that kills its worker counts too.
            let attempts = source["attempts"].as_u64().unwrap_or(0) + 1;
            source["attempts"] = json!(attempts);
            let answer = self.put("jobs", id, tenant, source, Some(version), false).await?;
            Ok::<Option<u32>, Error>(
                (answer.status != 409).then(|| u32::try_from(attempts).unwrap_or(u32::MAX)),
            )
        };
        if let Some(attempts) = leased(source, version).await? {
            return Ok(Some(attempts));
        }
        match self.get("jobs", id, tenant).await? {
            Some(current) if due_at(&current.source, docs::micros(now)) => {
                leased(current.source, (current.seq_no, current.primary_term)).await
            }
            _ => Ok(None),
        }
    }

    /// Reads by id, in one `_msearch`, the records of the recall hits whose documents
    /// carry no `record` (see `recalled`); a document gone meanwhile stays unread.
    async fn read_unrecorded(
        &self,
        scope: &Scope,
        legs: Vec<(&SearchFilter, &mut Vec<recalled::Found>)>,
    ) -> Result<()> {
        let mut searches = Vec::new();
        let mut unread = Vec::new();
        for (filter, found) in legs {
            let ids: Vec<&str> = found
                .iter()
                .filter(|found| found.source.is_none())
                .map(|found| found.id.as_str())
                .collect();
            if !ids.is_empty() {
                searches.push((tier_index(filter.tier), query::records_by_id(scope, filter, &ids)));
                unread.push(found);
            }
        }
        if searches.is_empty() {
            return Ok(());
        }
        let answers = self.scoped_searches(scope, searches).await?;
        for (found, answer) in unread.into_iter().zip(answers) {
            let mut sources: HashMap<String, Value> = records::hits(&answer)?
                .into_iter()
                .map(|hit| (hit.id, hit.source))
                .collect();
            for found in found.iter_mut().filter(|found| found.source.is_none()) {
                found.source = sources.remove(&found.id);
            }
        }
        Ok(())
    }

    /// Deletes every document of the scope matching `extra` in one index; returns how many.
    async fn erase_where(&self, scope: &Scope, kind: &str, extra: Vec<Value>) -> Result<u64> {
        let mut removed = 0;
        loop {
            let mut body = query::scoped(scope, extra.clone(), None, 500);
            body["_source"] = json!(false);
            let found = self.scoped_search(scope, kind, body).await?;
            if found.is_empty() {
                return Ok(removed);
            }
            let index = self.index(kind);
            let lines: Vec<Value> = found
                .iter()
                .map(|hit| json!({ "delete": { "_index": index, "_id": hit.id, "routing": scope.tenant().as_str() } }))
                .collect();
            self.bulk(lines, &[409]).await?;
            removed += found.len() as u64;
        }
    }
}

/// Positions reserved for an ingest's episodes.
struct Reservation {
    /// The first position.
    first: u64,
    /// The episode each session of the ingest ended with before, for the sessions the
    /// state remembers.
    previous: HashMap<String, String>,
    /// The scope's generation the positions were reserved under (see `erasure`).
    generation: u64,
}

/// What an edit of a scope's state document answers, and whether it must be written.
enum StateEdit<T> {
    Write(T),
    Keep(T),
}

/// The state document of a scope that has none yet.
fn fresh_state(scope: &Scope) -> Value {
    json!({ "tenant": scope.tenant().as_str(), "user": scope.user().as_str(), "id": state_id(scope),
            "allocated": 0 })
}

/// A position as the `long` field stores it: past its range, the largest it can hold
/// (a position beyond any stored one).
fn stored_position(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

fn require_status(fact: &Fact, allowed: &[FactStatus]) -> Result<()> {
    if allowed.contains(&fact.status) {
        Ok(())
    } else {
        Err(Error::Conflict {
            code: cairn_core::ErrorCode::NotActive,
            message: format!(
                "fact {} is {}, so it cannot be changed this way",
                fact.id,
                fact.status.as_str()
            ),
        })
    }
}

fn memory_of(tier: Tier, source: &Value) -> Result<Memory> {
    Ok(match tier {
        Tier::Semantic => Memory::Fact(records::read_fact(source)?),
        Tier::Episodic => Memory::Episode(records::read_episode(source)?.1),
        Tier::Procedural => Memory::Playbook(records::read_playbook(source)?),
    })
}

fn tier_index(tier: Tier) -> &'static str {
    match tier {
        Tier::Semantic => "facts",
        Tier::Episodic => "episodes",
        Tier::Procedural => "playbooks",
    }
}

/// Which of the scope's counts a text query's scores need.
fn counted(query: &TextQuery) -> statistics::Counted {
    statistics::Counted {
        tier: query.filter.tier,
        with_context: query.searches_context(),
    }
}

/// The scope's counts a text search's aggregation brought back ([`query::term_statistics`]).
fn counted_statistics(terms: &[bm25::Term], answer: &Value) -> ScopeStatistics {
    let counted = &answer["aggregations"]["scope"]["in_scope"];
    ScopeStatistics {
        documents: counted["doc_count"].as_u64().unwrap_or(0),
        containing: (0..terms.len())
            .map(|index| {
                counted["terms"]["buckets"][index]["doc_count"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .collect(),
    }
}

/// A leg's hits as its search answered them ([`recalled::found`]), each record without
/// its vector unless the leg asked for vectors.
fn leg_found(filter: &SearchFilter, answer: &Value) -> Result<Vec<recalled::Found>> {
    let mut found = recalled::found(answer)?;
    if !filter.with_vectors {
        for source in found.iter_mut().filter_map(|found| found.source.as_mut()) {
            if let Value::Object(fields) = source {
                fields.remove("vector");
            }
        }
    }
    Ok(found)
}

/// The records of a leg's hits, in order; a hit whose record could not be read (its
/// document is gone) is left out.
fn leg_records(found: Vec<recalled::Found>) -> impl Iterator<Item = (Value, f64)> {
    found
        .into_iter()
        .filter_map(|found| Some((found.source?, found.score)))
}

/// A text leg's hits: the candidates its search found, rescored by BM25 over the
/// scope's own `statistics` (kept, or counted by the answer's `scope` aggregation),
/// best first.
fn text_hits(
    query: &TextQuery,
    statistics: &ScopeStatistics,
    terms: &[bm25::Term],
    found: Vec<recalled::Found>,
) -> Result<Vec<TextHit>> {
    let tier = query.filter.tier;
    let found: Vec<Value> = leg_records(found).map(|(source, _)| source).collect();
    let context_weight = if query.searches_context() {
        Some(query.context_weight)
    } else {
        None
    };
    let fields: Vec<bm25::Fields<'_>> = found
        .iter()
        .map(|source| {
            let mut fields = vec![(source["text"].as_str().unwrap_or(""), 1.0)];
            if let (Some(weight), Some(context)) = (context_weight, source["context"].as_str()) {
                fields.push((context, weight));
            }
            fields
        })
        .collect();
    let scores = bm25::scores(terms, statistics, &fields);
    let mut hits = found
        .iter()
        .zip(scores)
        .map(|(source, score)| {
            Ok(TextHit {
                memory: memory_of(tier, source)?,
                score,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // Stable: candidates that score alike keep the index's order.
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(hits)
}

/// The hits of a vector search in `tier`, best first, scored by cosine similarity.
fn vector_hits(tier: Tier, found: Vec<recalled::Found>) -> Result<Vec<TextHit>> {
    let mut hits = leg_records(found)
        .map(|(source, score)| {
            Ok(TextHit {
                memory: memory_of(tier, &source)?,
                // Both engines score cosine as (1 + cos) / 2.
                score: 2.0 * score - 1.0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(hits)
}

#[async_trait::async_trait]
impl MemoryStore for ClusterStore {
    async fn ping(&self) -> Result<()> {
        self.ready()?;
        // Answering is not enough: after a restart the shards recover before writes work.
        let path = format!("/_cluster/health/{}-*", self.prefix);
        let health = self
            .cluster
            .expect(Method::Get, &path, &[("timeout", "2s".to_owned())], None)
            .await?;
        let status = health["status"].as_str();
        if let Ok(mut slot) = self.degraded.write() {
            *slot = (status == Some("yellow")).then(|| {
                format!(
                    "search cluster health yellow: {} unassigned shard(s), {} node(s) in the cluster; every primary is serving",
                    health["unassigned_shards"], health["number_of_nodes"]
                )
            });
        }
        match status {
            Some("green") | Some("yellow") => Ok(()),
            other => Err(Error::Unavailable(format!(
                "search cluster indices are {}",
                other.unwrap_or("unknown")
            ))),
        }
    }

    fn degraded(&self) -> Option<String> {
        self.degraded.read().ok().and_then(|note| note.clone())
    }

    async fn commit(&self, scope: &Scope, change_set: ChangeSet) -> Result<()> {
        self.ready()?;
        let committed = self.commit_change_set(scope, &change_set).await;
        // Applied or not, the scope's records may have changed: its counts go.
        self.statistics.written(scope);
        committed
    }

    async fn prepare_episodes(&self, scope: &Scope, episodes: &[cairn_core::Episode]) -> Result<()> {
        self.ready()?;
        self.prepare_ingest(scope, episodes).await
    }

    async fn recover_commits(&self, older_than: Duration) -> Result<u64> {
        self.ready()?;
        let recovered = match self.recover_journals(older_than).await {
            Ok(journals) => self
                .recover_erasures(older_than)
                .await
                .map(|erasures| journals + erasures),
            Err(error) => Err(error),
        };
        if !matches!(recovered, Ok(0)) {
            self.statistics.written_anywhere();
        }
        recovered
    }

    async fn get_fact(&self, scope: &Scope, fact_id: &str) -> Result<Option<Fact>> {
        self.ready()?;
        let Some(doc) = self.owned(scope, "facts", fact_id).await? else {
            return Ok(None);
        };
        let fact = records::read_fact(&doc.source)?;
        let mut facts = [fact];
        self.apply_counts(scope, &mut facts, true).await?;
        let [fact] = facts;
        Ok(Some(fact))
    }

    async fn get_facts(&self, scope: &Scope, fact_ids: &[String]) -> Result<Vec<Fact>> {
        self.ready()?;
        let ids: Vec<&str> = fact_ids.iter().map(String::as_str).collect();
        let mut facts = self
            .scoped_multi_get(scope, "facts", &ids, None, true)
            .await?
            .into_iter()
            .flatten()
            .map(|hit| records::read_fact(&hit.source))
            .collect::<Result<Vec<_>>>()?;
        self.apply_counts(scope, &mut facts, true).await?;
        Ok(facts)
    }

    async fn list_facts(
        &self,
        scope: &Scope,
        status: StatusFilter,
        as_of: DateTime<Utc>,
        page: &PageRequest,
    ) -> Result<Page<Fact>> {
        self.ready()?;
        let status = match status {
            StatusFilter::All => None,
            StatusFilter::Only(status) => Some(status),
        };
        let extra = query::status_condition(status, docs::micros(as_of));
        let mut page = self
            .page(scope, "facts", extra, "created_at", page, records::read_fact)
            .await?;
        self.apply_counts(scope, &mut page.items, true).await?;
        Ok(page)
    }

    async fn list_superseded_by(&self, scope: &Scope, fact_id: &str) -> Result<Vec<Fact>> {
        self.ready()?;
        let body = query::listing(
            scope,
            vec![json!({ "term": { "superseded_by": fact_id } })],
            "created_at",
            PAGE,
            None,
        );
        let mut facts = self
            .scoped_all(scope, "facts", body)
            .await?
            .iter()
            .map(|hit| records::read_fact(&hit.source))
            .collect::<Result<Vec<_>>>()?;
        self.apply_counts(scope, &mut facts, true).await?;
        facts.sort_by_key(|fact| fact.created_at);
        Ok(facts)
    }

    async fn find_active_facts_by_fingerprint(&self, scope: &Scope, value: &str) -> Result<Vec<Fact>> {
        self.ready()?;
        let body = query::listing(
            scope,
            vec![
                json!({ "term": { "fingerprint": value } }),
                json!({ "term": { "status": "active" } }),
            ],
            "created_at",
            100,
            None,
        );
        let mut facts = self
            .scoped_search(scope, "facts", body)
            .await?
            .iter()
            .map(|hit| records::read_fact(&hit.source))
            .collect::<Result<Vec<_>>>()?;
        facts.reverse();
        Ok(facts)
    }

    async fn find_tombstone(&self, scope: &Scope, value: &str) -> Result<Option<Tombstone>> {
        self.ready()?;
        let body = query::listing(
            scope,
            vec![
                json!({ "term": { "fingerprint": value } }),
                json!({ "bool": { "must_not": { "exists": { "field": "lifted_at" } } } }),
            ],
            "created_at",
            1,
            None,
        );
        self.scoped_search(scope, "tombstones", body)
            .await?
            .first()
            .map(|hit| records::read_tombstone(&hit.source))
            .transpose()
    }

    async fn get_episode(&self, scope: &Scope, episode_id: &str) -> Result<Option<Episode>> {
        self.ready()?;
        self.owned(scope, "episodes", episode_id)
            .await?
            .map(|doc| records::read_episode(&doc.source).map(|(_, episode)| episode))
            .transpose()
    }

    async fn list_episodes(
        &self,
        scope: &Scope,
        session: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<Episode>> {
        self.ready()?;
        let filters = session
            .map(|session| json!({ "term": { "session_id": session } }))
            .into_iter()
            .collect();
        self.page(scope, "episodes", filters, "position", page, |source| {
            records::read_episode(source).map(|(_, episode)| episode)
        })
        .await
    }

    async fn get_playbook(&self, scope: &Scope, playbook_id: &str) -> Result<Option<Playbook>> {
        self.ready()?;
        let Some(doc) = self.owned(scope, "playbooks", playbook_id).await? else {
            return Ok(None);
        };
        let playbook = records::read_playbook(&doc.source)?;
        let mut playbooks = [playbook];
        self.apply_counts(scope, &mut playbooks, true).await?;
        let [playbook] = playbooks;
        Ok(Some(playbook))
    }

    async fn playbook_versions(&self, scope: &Scope, playbook_id: &str) -> Result<Vec<Playbook>> {
        self.ready()?;
        let body = query::scoped(
            scope,
            vec![json!({ "term": { "playbook_id": playbook_id } })],
            Some(json!([{ "version": "asc" }, { "id": "asc" }])),
            PAGE,
        );
        self.scoped_all(scope, "playbook-versions", body)
            .await?
            .iter()
            .map(|hit| records::read_playbook_version(&hit.source))
            .collect()
    }

    async fn list_playbooks(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Playbook>> {
        self.ready()?;
        let mut page = self
            .page(
                scope,
                "playbooks",
                Vec::new(),
                "created_at",
                page,
                records::read_playbook,
            )
            .await?;
        self.apply_counts(scope, &mut page.items, true).await?;
        Ok(page)
    }

    async fn apply_usage(&self, scope: &Scope, memories: &mut [&mut Memory]) -> Result<()> {
        self.ready()?;
        self.apply_counts(scope, memories, false).await
    }

    async fn make_ingests_searchable(&self) -> Result<()> {
        self.ready()?;
        self.refresh_indices(&["episodes", "jobs"]).await
    }

    async fn search_text(&self, scope: &Scope, query: &TextQuery) -> Result<Vec<TextHit>> {
        let mut legs = self.search_texts(scope, std::slice::from_ref(query)).await?;
        Ok(legs.pop().unwrap_or_default())
    }

    async fn search_vector(&self, scope: &Scope, query: &VectorQuery) -> Result<Vec<TextHit>> {
        let mut legs = self.search_vectors(scope, std::slice::from_ref(query)).await?;
        Ok(legs.pop().unwrap_or_default())
    }

    /// Every text leg in one `_msearch`; each search also counts the scope's term
    /// statistics that score its candidates.
    async fn search_texts(&self, scope: &Scope, queries: &[TextQuery]) -> Result<Vec<Vec<TextHit>>> {
        Ok(self.search_legs(scope, queries, &[]).await?.0)
    }

    /// Every vector leg in one `_msearch`.
    async fn search_vectors(&self, scope: &Scope, queries: &[VectorQuery]) -> Result<Vec<Vec<TextHit>>> {
        Ok(self.search_legs(scope, &[], queries).await?.1)
    }

    /// Every leg of a recall, text and vector, in one `_msearch`.
    async fn search_legs(
        &self,
        scope: &Scope,
        texts: &[TextQuery],
        vectors: &[VectorQuery],
    ) -> Result<(Vec<Vec<TextHit>>, Vec<Vec<TextHit>>)> {
        self.ready()?;
        let terms: Vec<Vec<bm25::Term>> = texts.iter().map(|query| bm25::query_terms(&query.text)).collect();
        let stems: Vec<Vec<&str>> = terms
            .iter()
            .map(|terms| terms.iter().map(|term| term.stem.as_str()).collect())
            .collect();
        // The scope's counts of each query's terms, when this process knows them.
        let known: Vec<(Option<ScopeStatistics>, statistics::Ticket)> = texts
            .iter()
            .zip(&stems)
            .map(|(query, stems)| self.statistics.lookup(scope, counted(query), stems))
            .collect();
        // `text_search` has no body for a query without a searchable term.
        let mut searches: Vec<(&str, Value)> = texts
            .iter()
            .zip(&terms)
            .zip(&known)
            .filter_map(|((query, terms), (known, _))| {
                Some((
                    tier_index(query.filter.tier),
                    query::text_search(scope, query, terms, known.is_none())?,
                ))
            })
            .collect();
        let form = query::KnnForm::of(self.engine, &self.version());
        searches.extend(vectors.iter().map(|query| {
            let body = query::vector_search(form, scope, &query.filter, &query.vector);
            (tier_index(query.filter.tier), body)
        }));
        let mut answers = self.scoped_searches(scope, searches).await?.into_iter();
        let mut next = || {
            answers
                .next()
                .ok_or_else(|| Error::Storage("_msearch: an answer is missing".into()))
        };
        let mut text_found = Vec::with_capacity(texts.len());
        for (((query, terms), stems), (known, ticket)) in texts.iter().zip(&terms).zip(&stems).zip(known) {
            if terms.is_empty() {
                text_found.push(None);
                continue;
            }
            let answer = next()?;
            let statistics = match known {
                Some(statistics) => statistics,
                None => {
                    let statistics = counted_statistics(terms, &answer);
                    self.statistics.keep(
                        scope,
                        counted(query),
                        stems,
                        &statistics,
                        ticket,
                        std::time::Instant::now(),
                    );
                    statistics
                }
            };
            text_found.push(Some((leg_found(&query.filter, &answer)?, statistics)));
        }
        let mut vector_found = Vec::with_capacity(vectors.len());
        for query in vectors {
            vector_found.push(leg_found(&query.filter, &next()?)?);
        }
        {
            let mut legs: Vec<(&SearchFilter, &mut Vec<recalled::Found>)> = texts
                .iter()
                .zip(text_found.iter_mut())
                .filter_map(|(query, found)| Some((&query.filter, &mut found.as_mut()?.0)))
                .collect();
            legs.extend(
                vectors
                    .iter()
                    .map(|query| &query.filter)
                    .zip(vector_found.iter_mut()),
            );
            self.read_unrecorded(scope, legs).await?;
        }
        let mut text_legs = Vec::with_capacity(texts.len());
        for ((query, terms), found) in texts.iter().zip(&terms).zip(text_found) {
            text_legs.push(match found {
                Some((found, statistics)) => text_hits(query, &statistics, terms, found)?,
                None => Vec::new(),
            });
        }
        let mut vector_legs = Vec::with_capacity(vectors.len());
        for (query, found) in vectors.iter().zip(vector_found) {
            vector_legs.push(vector_hits(query.filter.tier, found)?);
        }
        Ok((text_legs, vector_legs))
    }

    async fn claim_embedding_space(&self, model_id: &str, dimension: usize) -> Result<()> {
        self.claim_space(model_id, dimension).await
    }

    async fn take_rate(
        &self,
        tenant: &cairn_core::TenantLimits,
        quota: cairn_core::RateQuota,
        want: u32,
        least: u32,
        now: DateTime<Utc>,
    ) -> Result<Option<cairn_core::RateGrant>> {
        self.ready()?;
        self.take_rate_cells(tenant, quota, want, least, now)
            .await
            .map(Some)
    }

    async fn spend_tokens(
        &self,
        tenant: &cairn_core::TenantLimits,
        day: chrono::NaiveDate,
        tokens: u64,
    ) -> Result<Option<u64>> {
        self.ready()?;
        self.spend_day_tokens(tenant, day, tokens).await.map(Some)
    }

    async fn use_once(&self, key: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> Result<bool> {
        self.ready()?;
        let id = format!("used:{key}");
        let body = json!({ "id": id, "until": docs::micros(until) });
        for _ in 0..10 {
            let answer = self.put("state", &id, SYSTEM, body.clone(), None, false).await?;
            if answer.ok() {
                return Ok(true);
            }
            // Used before: again only once that use has expired (compare-and-set).
            let Some(used) = self.get("state", &id, SYSTEM).await? else {
                continue;
            };
            if used.source["until"]
                .as_i64()
                .is_some_and(|at| at >= docs::micros(now))
            {
                return Ok(false);
            }
            let version = Some((used.seq_no, used.primary_term));
            if self
                .put("state", &id, SYSTEM, body.clone(), version, false)
                .await?
                .ok()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn record_usage(&self, scope: &Scope, uses: &[UseCount]) -> Result<()> {
        self.ready()?;
        self.add_usage(scope, uses).await
    }

    async fn list_users(&self, tenant: &TenantScope, page: &PageRequest) -> Result<Page<UserSummary>> {
        self.ready()?;
        let routing = Some(tenant.tenant().as_str());
        let indices = ["episodes", "facts", "playbooks"]
            .map(|kind| self.index(kind))
            .join(",");
        let answer = self
            .search_in(
                &indices,
                routing,
                query::tenant_users(tenant, page.cursor.as_deref(), page.limit),
            )
            .await?;
        let mut users: Vec<UserSummary> = answer["aggregations"]["users"]["buckets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|bucket| {
                let held = |kind: &str| {
                    bucket["kinds"]["buckets"]
                        .as_array()
                        .and_then(|kinds| {
                            kinds
                                .iter()
                                .find(|entry| entry["key"].as_str() == Some(&self.index(kind)))
                        })
                        .and_then(|entry| entry["doc_count"].as_u64())
                        .unwrap_or(0)
                };
                UserSummary {
                    user: bucket["key"]["user"].as_str().unwrap_or_default().to_owned(),
                    episodes: held("episodes"),
                    facts: held("facts"),
                    active_facts: bucket["active"]["doc_count"].as_u64().unwrap_or(0),
                    playbooks: held("playbooks"),
                    last_activity: docs::epoch_millis(&bucket["latest"]["value"]),
                }
            })
            .collect();
        if !users.is_empty() {
            let names: Vec<&str> = users.iter().map(|user| user.user.as_str()).collect();
            let audit = self
                .search("audit", routing, query::latest_audit(tenant, &names))
                .await?;
            for bucket in audit["aggregations"]["users"]["buckets"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let at = docs::epoch_millis(&bucket["latest"]["value"]);
                if let Some(user) = users
                    .iter_mut()
                    .find(|user| bucket["key"].as_str() == Some(user.user.as_str()))
                {
                    user.last_activity = user.last_activity.max(at);
                }
            }
        }
        let next_cursor = (users.len() == page.limit && page.limit > 0)
            .then(|| users.last().map(|user| user.user.clone()))
            .flatten();
        Ok(Page {
            items: users,
            next_cursor,
        })
    }

    async fn list_decisions(
        &self,
        scope: &Scope,
        kind: Option<DecisionKind>,
        page: &PageRequest,
    ) -> Result<Page<Decision>> {
        self.ready()?;
        self.page(
            scope,
            "decisions",
            kind.map(|kind| json!({ "term": { "kind": kind.as_str() } }))
                .into_iter()
                .collect(),
            "created_at",
            page,
            records::read_decision,
        )
        .await
    }

    async fn list_audit(&self, scope: &Scope, page: &PageRequest) -> Result<Page<AuditEvent>> {
        self.ready()?;
        self.page(scope, "audit", Vec::new(), "at", page, records::read_audit)
            .await
    }

    async fn get_review(&self, scope: &Scope, review_id: &str) -> Result<Option<Review>> {
        self.ready()?;
        self.owned(scope, "reviews", review_id)
            .await?
            .map(|doc| records::read_review(&doc.source))
            .transpose()
    }

    async fn list_reviews(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Review>> {
        self.ready()?;
        Ok(self
            .review_page(scope.tenant().as_str(), page, |limit, after| {
                query::scope_review_queue(scope, limit, after)
            })
            .await?
            .map(|item| item.review))
    }

    async fn list_tenant_reviews(
        &self,
        tenant: &TenantScope,
        page: &PageRequest,
    ) -> Result<Page<cairn_core::UserReview>> {
        self.ready()?;
        self.review_page(tenant.tenant().as_str(), page, |limit, after| {
            query::tenant_review_queue(tenant, limit, after)
        })
        .await
    }

    async fn review_queues(&self, limit: usize) -> Result<Vec<cairn_core::TenantQueue>> {
        self.ready()?;
        let answer = self.search("reviews", None, query::review_queues(limit)).await?;
        let mut queues = Vec::new();
        for bucket in answer["aggregations"]["tenants"]["buckets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if let (Some(tenant), Some(pending)) = (bucket["key"].as_str(), bucket["doc_count"].as_u64()) {
                queues.push(cairn_core::TenantQueue {
                    tenant: tenant.to_owned(),
                    pending,
                    oldest: bucket["oldest"]["value"]
                        .as_f64()
                        .and_then(|micros| DateTime::from_timestamp_micros(micros as i64)),
                });
            }
        }
        Ok(queues)
    }

    async fn review_summary(&self, tenant: &TenantScope) -> Result<ReviewSummary> {
        self.ready()?;
        let answer = self
            .search(
                "reviews",
                Some(tenant.tenant().as_str()),
                query::review_summary(tenant),
            )
            .await?;
        let mut summary = ReviewSummary::default();
        for bucket in answer["aggregations"]["kinds"]["buckets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if let (Some(kind), Some(count)) = (
                bucket["key"].as_str().and_then(ReviewKind::parse),
                bucket["doc_count"].as_u64(),
            ) {
                summary.by_kind.push((kind, count));
            }
        }
        summary.by_kind.sort();
        summary.oldest = answer["aggregations"]["oldest"]["value"]
            .as_f64()
            .and_then(|micros| DateTime::from_timestamp_micros(micros as i64));
        Ok(summary)
    }

    async fn find_reviews_by_fingerprint(&self, scope: &Scope, value: &str) -> Result<Vec<Review>> {
        self.ready()?;
        let body = query::listing(
            scope,
            vec![json!({ "term": { "fingerprint": value } })],
            "created_at",
            100,
            None,
        );
        self.scoped_search(scope, "reviews", body)
            .await?
            .iter()
            .map(|hit| records::read_review(&hit.source))
            .collect()
    }

    /// One search: the newest pending or rejected review of each value
    /// ([`query::newest_per_value`]).
    async fn held_or_rejected_values(
        &self,
        scope: &Scope,
        fingerprints: &[String],
    ) -> Result<HashMap<String, Review>> {
        self.ready()?;
        let mut found = HashMap::new();
        if fingerprints.is_empty() {
            return Ok(found);
        }
        let open = json!({ "terms": { "status": ["pending", "rejected"] } });
        let body = query::newest_per_value(scope, fingerprints, open);
        for hit in self.scoped_search(scope, "reviews", body).await? {
            let review = records::read_review(&hit.source)?;
            found.entry(review.fingerprint.clone()).or_insert(review);
        }
        Ok(found)
    }

    async fn list_tombstones(&self, scope: &Scope) -> Result<Vec<Tombstone>> {
        self.ready()?;
        let body = query::listing(
            scope,
            vec![json!({ "bool": { "must_not": { "exists": { "field": "lifted_at" } } } })],
            "created_at",
            PAGE,
            None,
        );
        self.scoped_all(scope, "tombstones", body)
            .await?
            .iter()
            .map(|hit| records::read_tombstone(&hit.source))
            .collect()
    }

    async fn audit_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>> {
        self.ready()?;
        use base64::Engine as _;
        let codec = base64::engine::general_purpose::STANDARD;
        self.edit_state(scope, "audit key", |state| match state["audit_key"].as_str() {
            Some(key) => codec
                .decode(key)
                .map(StateEdit::Keep)
                .map_err(|error| Error::Storage(format!("state audit_key: {error}"))),
            None => {
                state["audit_key"] = json!(codec.encode(candidate));
                Ok(StateEdit::Write(candidate.to_vec()))
            }
        })
        .await
    }

    async fn tenant_key(&self, scope: &Scope, candidate: [u8; 32]) -> Result<Vec<u8>> {
        self.ready()?;
        use base64::Engine as _;
        let codec = base64::engine::general_purpose::STANDARD;
        let tenant = scope.tenant().as_str();
        let id = format!("tenant-key:{tenant}");
        let body = json!({ "tenant": tenant, "id": id, "audit_key": codec.encode(candidate) });
        // Created once (the first creator wins), then read.
        self.put("state", &id, tenant, body, None, false).await?;
        let stored = self
            .get("state", &id, tenant)
            .await?
            .ok_or_else(|| Error::Storage("the tenant key vanished".into()))?;
        codec
            .decode(stored.source["audit_key"].as_str().unwrap_or_default())
            .map_err(|error| Error::Storage(format!("state tenant key: {error}")))
    }

    async fn watermark(&self, scope: &Scope) -> Result<u64> {
        self.ready()?;
        Ok(self.watermark_doc(scope).await?.0)
    }

    async fn episodes_after(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>> {
        self.ready()?;
        let state = self.state(scope).await?;
        let allocated = state
            .as_ref()
            .and_then(|doc| doc.source["allocated"].as_u64())
            .unwrap_or(0);
        // Positions at or below the floor were reserved before the scope's last erasure.
        let floor = state
            .as_ref()
            .and_then(|doc| doc.source["floor"].as_u64())
            .unwrap_or(0);
        let position = position.max(floor);
        // Positions are reserved before their episodes are written: stop at a gap unless
        // its own reservation is old enough that it can no longer fill (see `gaps`).
        let reservations = state
            .as_ref()
            .map(|doc| gaps::Reservations::of(&doc.source))
            .unwrap_or_default();
        let cutoff = self.gap_cutoff();
        // Positions this process reserved are read by id, without a refresh.
        if let Some(episodes) = self.reserved_episodes(scope, position, allocated, limit).await? {
            return Ok(episodes);
        }
        let body = query::scoped(
            scope,
            vec![json!({ "range": { "position": { "gt": stored_position(position) } } })],
            Some(json!([{ "position": "asc" }])),
            limit,
        );
        let mut found = self.scoped_search(scope, "episodes", body.clone()).await?;
        // Ingests are not refreshed: reserved positions the search cannot see yet may be
        // written and waiting for the next refresh, which this makes now.
        let last_seen = match found.last() {
            Some(hit) => records::read_episode(&hit.source)?.0,
            None => position,
        };
        if found.len() < limit
            && last_seen < allocated
            && reservations.young(last_seen + 1, allocated, cutoff)
        {
            self.refresh_indices(&["episodes"]).await?;
            found = self.scoped_search(scope, "episodes", body).await?;
        }
        let mut expected = position + 1;
        let mut episodes = Vec::new();
        for hit in &found {
            let (at, episode) = records::read_episode(&hit.source)?;
            if at > expected && reservations.young(expected, at - 1, cutoff) {
                break;
            }
            expected = at + 1;
            episodes.push(LoggedEpisode {
                position: at,
                episode,
            });
        }
        Ok(episodes)
    }

    async fn gap_after(&self, scope: &Scope, position: u64) -> Result<Option<DateTime<Utc>>> {
        self.ready()?;
        let Some(state) = self.state(scope).await? else {
            return Ok(None);
        };
        let floor = state.source["floor"].as_u64().unwrap_or(0);
        let settles = gaps::Reservations::of(&state.source).settles_at(
            position.max(floor),
            self.gap_cutoff(),
            self.gap_patience_micros(),
        );
        Ok(settles.and_then(DateTime::from_timestamp_micros))
    }

    async fn episodes_up_to(&self, scope: &Scope, position: u64, limit: usize) -> Result<Vec<LoggedEpisode>> {
        self.ready()?;
        let body = query::scoped(
            scope,
            vec![json!({ "range": { "position": { "lte": stored_position(position) } } })],
            Some(json!([{ "position": "desc" }])),
            limit,
        );
        let mut episodes = self
            .scoped_search(scope, "episodes", body)
            .await?
            .iter()
            .map(|hit| {
                records::read_episode(&hit.source)
                    .map(|(position, episode)| LoggedEpisode { position, episode })
            })
            .collect::<Result<Vec<_>>>()?;
        episodes.reverse();
        Ok(episodes)
    }

    async fn pending_jobs(&self, scope: &Scope) -> Result<Vec<ConsolidationJob>> {
        self.ready()?;
        let body = query::scoped(
            scope,
            Vec::new(),
            Some(json!([{ "created_at": "asc" }, { "id": "asc" }])),
            PAGE,
        );
        self.scoped_all(scope, "jobs", body)
            .await?
            .iter()
            .map(|hit| records::read_job(&hit.source))
            .collect()
    }

    /// A search that reads no document: the scope's jobs counted up to `up_to`.
    async fn count_pending_jobs(&self, scope: &Scope, up_to: usize) -> Result<usize> {
        self.ready()?;
        let mut body = query::scoped(scope, Vec::new(), None, 0);
        body["track_total_hits"] = json!(up_to);
        let answer = self.search("jobs", Some(scope.tenant().as_str()), body).await?;
        let total = answer["hits"]["total"]["value"]
            .as_u64()
            .ok_or_else(|| Error::Storage("jobs search answer without a total".into()))?;
        Ok(usize::try_from(total).unwrap_or(usize::MAX).min(up_to))
    }

    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        after_tenant: Option<&str>,
    ) -> Result<Option<(Scope, ConsolidationJob)>> {
        self.ready()?;
        let mut due = records::hits(
            &self
                .search("jobs", None, query::due_jobs(docs::micros(now), after_tenant, 10))
                .await?,
        )?;
        if due.is_empty() && after_tenant.is_some() {
            // Past the last tenant in name order: wrap around.
            due = records::hits(
                &self
                    .search("jobs", None, query::due_jobs(docs::micros(now), None, 10))
                    .await?,
            )?;
        }
        for hit in due {
            let owner: records::Owner = hit.read()?;
            let mut job = records::read_job(&hit.source)?;
            let version = hit.version()?;
            let Some(attempts) = self
                .lease(&job.id, &owner.tenant, version, hit.source, now, lease_until)
                .await?
            else {
                continue; // another worker took it
            };
            job.attempts = attempts;
            // The job was written under an authenticated scope; a document that no longer
            // parses as one is reported, never guessed at.
            let tenant = TenantId::parse(&owner.tenant)?;
            let user = UserId::parse(&owner.user)?;
            #[allow(clippy::disallowed_methods)]
            let scope = Scope::of_stored_record(tenant, user, job.subject.clone());
            return Ok(Some((scope, job)));
        }
        Ok(None)
    }

    async fn release_job(
        &self,
        scope: &Scope,
        job_id: &str,
        run_after: DateTime<Utc>,
        error: &str,
        dead: bool,
    ) -> Result<()> {
        // Through `change_owned`: a renewal racing the release (the run's heartbeat) moves
        // the job's version, and the release must read it again, not be lost to a 409.
        self.change_owned(scope, "jobs", job_id, |source| {
            let now = Utc::now();
            source["run_after"] = json!(docs::micros(run_after));
            source["last_error"] = json!(error);
            source["timestamp"] = json!(docs::timestamp(now));
            if dead {
                source["dead_at"] = json!(docs::micros(now));
            }
            if let Value::Object(map) = source {
                map.remove("leased_until");
            }
            true
        })
        .await?;
        Ok(())
    }

    async fn renew_job(&self, scope: &Scope, job_id: &str, until: DateTime<Utc>) -> Result<bool> {
        self.change_owned(scope, "jobs", job_id, |source| {
            if source.get("leased_until").is_none_or(Value::is_null) {
                return false;
            }
            source["leased_until"] = json!(docs::micros(until));
            true
        })
        .await
    }

    async fn defer_job(&self, scope: &Scope, job_id: &str, run_after: DateTime<Utc>) -> Result<()> {
        self.change_owned(scope, "jobs", job_id, |source| {
            source["attempts"] = json!(source["attempts"].as_u64().unwrap_or(0).saturating_sub(1));
            source["run_after"] = json!(docs::micros(run_after));
            if let Value::Object(map) = source {
                map.remove("leased_until");
            }
            true
        })
        .await
        .map(|_| ())
    }

    async fn lease_scope_runs(
        &self,
        scope: &Scope,
        holder: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool> {
        self.ready()?;
        let tenant = scope.tenant().as_str();
        let id = runs_id(scope);
        let lease = json!({ "tenant": tenant, "user": scope.user().as_str(), "id": id,
                            "holder": holder, "until": docs::micros(until) });
        for _ in 0..10 {
            let current = self.get("state", &id, tenant).await?;
            let version = match &current {
                Some(doc) => {
                    let other = doc.source["holder"].as_str().is_some_and(|held| held != holder);
                    let lasting = doc.source["until"]
                        .as_i64()
                        .is_some_and(|at| at > docs::micros(now));
                    if other && lasting {
                        return Ok(false);
                    }
                    Some((doc.seq_no, doc.primary_term))
                }
                None => None,
            };
            let answer = self
                .put("state", &id, tenant, lease.clone(), version, false)
                .await?;
            if answer.ok() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn release_scope_runs(&self, scope: &Scope, holder: &str) -> Result<()> {
        self.ready()?;
        let tenant = scope.tenant().as_str();
        let id = runs_id(scope);
        if let Some(doc) = self.get("state", &id, tenant).await?
            && doc.source["holder"].as_str() == Some(holder)
        {
            self.delete_doc("state", &id, tenant, Some((doc.seq_no, doc.primary_term)), false)
                .await?;
        }
        Ok(())
    }

    async fn claim_import(
        &self,
        scope: &Scope,
        claim: &str,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<()> {
        self.ready()?;
        let (now, stale_before) = (docs::micros(now), docs::micros(stale_before));
        self.edit_state(scope, "import claim", |state| {
            let held = &state["import"];
            if let (Some(other), Some(at)) = (held["claim"].as_str(), held["at"].as_i64())
                && other != claim
                && at >= stale_before
            {
                return Err(Error::import_under_way());
            }
            state["import"] = json!({ "claim": claim, "at": now });
            Ok(StateEdit::Write(()))
        })
        .await
    }

    async fn release_import(&self, scope: &Scope, claim: &str) -> Result<()> {
        self.ready()?;
        self.edit_state(scope, "import claim", |state| {
            if state["import"]["claim"].as_str() != Some(claim) {
                return Ok(StateEdit::Keep(()));
            }
            if let Value::Object(map) = state {
                map.remove("import");
            }
            Ok(StateEdit::Write(()))
        })
        .await
    }

    async fn generation(&self, scope: &Scope) -> Result<u64> {
        self.ready()?;
        Ok(self
            .state(scope)
            .await?
            .map_or(0, |doc| erasure::generation_of(&doc.source)))
    }

    async fn erase_scope(&self, scope: &Scope, audit: AuditEvent) -> Result<ErasureReceipt> {
        self.ready()?;
        self.erase(scope, &audit).await
    }
}
