// Cairn Inspector: a console over Cairn's public REST API. Every stored text is
// rendered as text (DOM nodes, never HTML strings); the token lives in this tab's
// sessionStorage only and is sent in the Authorization header, never in a URL.

const TOKEN_KEY = "cairn.inspector.token";
const PAGE = 50;
const main = document.getElementById("main");
const who = document.getElementById("who");

// ---------------------------------------------------------------- DOM helpers
function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "class") element.className = value;
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const when = (value) => (value ? new Date(value).toLocaleString() : "");
const status = (value) => h("span", { class: `status-${value}` }, value);
const table = (headers, rows) =>
  h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
const userPath = (user) => `/v1/users/${encodeURIComponent(user)}`;
const link = (hash, text) => h("a", { href: hash }, text);

function show(...children) {
  main.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
  main.focus();
}

// ---------------------------------------------------------------- the token
function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function claims() {
  try {
    const payload = token().split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload.padEnd(payload.length + ((4 - (payload.length % 4)) % 4), "=")));
  } catch {
    return {};
  }
}

function scopes() {
  return new Set(String(claims().scope ?? "").split(/\s+/).filter(Boolean));
}
const can = (permission) => scopes().has("memory:admin") || scopes().has(`memory:${permission}`);

// ---------------------------------------------------------------- the API
class ApiError extends Error {
  constructor(status, code, message, requestId) {
    super(`${status} ${code}: ${message}${requestId ? ` (request ${requestId})` : ""}`);
    Object.assign(this, { status, code, requestId });
  }
}

async function api(method, path, body) {
  const headers = { authorization: `Bearer ${token()}`, accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  const parsed = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = parsed?.error ?? {};
    if (response.status === 401) signOut(`Signed out: ${error.message ?? "the token was refused"}`);
    throw new ApiError(response.status, error.code ?? "http_error", error.message ?? `HTTP ${response.status}`, error.request_id);
  }
  return parsed;
}

const failure = (error) => h("p", { class: "error", role: "alert" }, String(error.message ?? error));

/** A list that loads a page at a time, with a "Load more" button. */
function pagedTable(headers, path, query, row) {
  const body = h("tbody");
  const more = h("button", { type: "button" }, "Load more");
  const message = h("p", { class: "muted" });
  let cursor;
  async function load() {
    more.disabled = true;
    try {
      const params = new URLSearchParams(Object.entries({ ...query, limit: String(PAGE) }).filter(([, value]) => value));
      if (cursor) params.set("cursor", cursor);
      const page = await api("GET", `${path}?${params}`);
      body.append(...page.items.map(row));
      cursor = page.next_cursor;
      more.classList.toggle("hidden", !cursor);
      message.textContent = body.children.length ? "" : "Nothing here.";
    } catch (error) {
      message.replaceChildren(failure(error));
    }
    more.disabled = false;
  }
  more.addEventListener("click", load);
  load();
  return h("div", {},
    h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), body)),
    message, more);
}

// ---------------------------------------------------------------- confirmation
function confirmAction(text, { reason = false, tombstone = false } = {}) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-reason-label").classList.toggle("hidden", !reason);
  document.getElementById("confirm-tombstone-label").classList.toggle("hidden", !tombstone);
  const input = document.getElementById("confirm-reason");
  const never = document.getElementById("confirm-tombstone");
  input.value = "";
  never.checked = false;
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? { reason: input.value.trim(), tombstone: never.checked } : null),
      { once: true },
    );
    dialog.showModal();
  });
}

// ---------------------------------------------------------------- views
function signIn(notice) {
  who.replaceChildren();
  const area = h("textarea", { id: "token", autocomplete: "off", spellcheck: "false", "aria-label": "Bearer token" });
  const form = h("form", { class: "card", id: "sign-in" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste a bearer token (cairn token mint). It is kept for this tab only."),
    notice ? h("p", { class: "error" }, notice) : null,
    area,
    h("p", {}, h("button", { class: "primary", type: "submit" }, "Sign in")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = area.value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    location.hash = "#/";
    route();
  });
  show(form);
  area.focus();
}

function signOut(notice) {
  sessionStorage.removeItem(TOKEN_KEY);
  signIn(notice);
}

function header() {
  const c = claims();
  const expires = c.exp ? new Date(c.exp * 1000).toLocaleString() : "never";
  who.replaceChildren(...[
    h("span", { class: "pill", id: "tenant" }, `tenant ${c.tenant ?? "?"}`),
    c.user ? h("span", { class: "pill" }, `bound to ${c.user}`) : null,
    h("span", { class: "pill", id: "scopes" }, [...scopes()].join(" ") || "no memory scope"),
    h("span", { class: "pill" }, `expires ${expires}`),
    h("button", { type: "button", onclick: () => signOut() }, "Sign out"),
  ].filter(Boolean));
}

function home() {
  const c = claims();
  if (c.user) {
    location.hash = `#/users/${encodeURIComponent(c.user)}/facts`;
    return;
  }
  const input = h("input", { id: "open-user", type: "text", placeholder: "user id", "aria-label": "User id" });
  const open = h("form", { class: "row" }, input, h("button", { type: "submit" }, "Open user"));
  open.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) location.hash = `#/users/${encodeURIComponent(input.value.trim())}/facts`;
  });
  const users = can("admin")
    ? pagedTable(["user", "facts", "active", "episodes", "playbooks", "last activity"], "/v1/users", {}, (u) =>
        h("tr", {},
          h("td", {}, link(`#/users/${encodeURIComponent(u.user)}/facts`, u.user)),
          h("td", {}, u.facts), h("td", {}, u.active_facts), h("td", {}, u.episodes), h("td", {}, u.playbooks),
          h("td", {}, when(u.last_activity))))
    : h("p", { class: "muted" }, "Listing users needs the memory:admin scope; open a user by id.");
  show(h("h1", {}, "Users"), open, users, can("review") ? tenantQueue() : null);
}

// ---------------------------------------------------------------- review
/** One pending review as a row: what it would change, why it waits, and the decision. */
function reviewRow(review, { withUser = false } = {}) {
  const user = review.user;
  const factHref = (id) => `#/users/${encodeURIComponent(user)}/fact/${encodeURIComponent(id)}`;
  const approve = h("button", { type: "button", class: "primary", "data-action": "approve", onclick: () => decideReview(review, "approve") }, "Approve");
  const reject = h("button", { type: "button", class: "danger", "data-action": "reject", onclick: () => decideReview(review, "reject") }, "Reject");
  return h("tr", { "data-review": review.id },
    withUser ? h("td", {}, link(`#/users/${encodeURIComponent(user)}/reviews`, user)) : null,
    h("td", {}, review.kind.replace("_", " ")),
    h("td", { class: "text proposed" }, review.fact ? link(factHref(review.fact.id), review.fact.text) : review.fact_id),
    h("td", { class: "text current" }, review.target ? link(factHref(review.target.id), review.target.text) : h("span", { class: "muted" }, review.target_id ?? "—")),
    h("td", {}, h("code", {}, review.rule), h("div", { class: "muted" }, review.reason)),
    h("td", {}, when(review.created_at), h("div", { class: "muted" }, review.proposed_by)),
    h("td", { class: "actions" }, approve, " ", reject));
}

const REVIEW_HEADERS = ["kind", "proposed", "replaces", "held by", "held", ""];

async function decideReview(review, verb) {
  const proposed = review.fact?.text ?? review.fact_id;
  const answer = verb === "approve"
    ? await confirmAction(`Approve the ${review.kind.replace("_", " ")} "${proposed}"? It becomes current memory.`)
    : await confirmAction(`Reject "${proposed}"? It is never recalled.`, { reason: true, tombstone: true });
  if (!answer) return;
  try {
    const body = verb === "approve" ? undefined : { ...(answer.reason ? { reason: answer.reason } : {}), tombstone: answer.tombstone };
    await api("POST", `${userPath(review.user)}/reviews/${encodeURIComponent(review.id)}/${verb}`, body);
    route();
  } catch (error) {
    main.append(failure(error));
  }
}

/** The tenant's queue, oldest first, with its counts (a token bound to no user). */
function tenantQueue() {
  const counts = h("p", { class: "muted", id: "review-counts" }, "Loading…");
  api("GET", "/v1/reviews?limit=1")
    .then((queue) => {
      const c = queue.counts;
      counts.textContent = c.total
        ? `${c.total} pending: ${c.new_fact} new, ${c.supersession} supersessions, ${c.retraction} retractions, ` +
          `${c.tombstone_lift} tombstone lifts; oldest held ${when(c.oldest)}`
        : "Nothing waits for review.";
    })
    .catch((error) => counts.replaceChildren(failure(error)));
  return h("section", { id: "review-queue" },
    h("h2", {}, "Review queue"), counts,
    pagedTable(["user", ...REVIEW_HEADERS], "/v1/reviews", {}, (review) => reviewRow(review, { withUser: true })));
}

function reviews(user) {
  return h("section", { id: "user-reviews" },
    h("p", { class: "muted" }, "Outcomes held for review, oldest first. Until approved they change nothing and are recalled only on request."),
    pagedTable(REVIEW_HEADERS, `${userPath(user)}/reviews`, {}, (review) => reviewRow(review)));
}

const TABS = [
  ["facts", "Facts"], ["tombstones", "Tombstones"], ["episodes", "Episodes"], ["playbooks", "Playbooks"],
  ["decisions", "Decisions"], ["recall", "Recall"], ["jobs", "Consolidation"], ["reviews", "Reviews"], ["audit", "Audit"],
];
/** The sections this token may open. */
const tabsAllowed = () =>
  TABS.filter(([key]) => (key !== "audit" || can("admin")) && (key !== "reviews" || can("review")));

function userView(user, tab, rest) {
  const tabs = h("nav", { class: "tabs", "aria-label": "User sections" },
    tabsAllowed().map(([key, label]) =>
      h("a", { href: `#/users/${encodeURIComponent(user)}/${key}`, "aria-current": key === tab ? "page" : undefined }, label)));
  const erase = can("admin") && tab === "facts"
    ? h("button", { type: "button", class: "danger", id: "erase-user", onclick: () => eraseUser(user) }, "Erase user")
    : null;
  const views = { facts, tombstones, episodes, playbooks, decisions, recall, jobs, reviews, audit, fact: factView };
  const content = (views[tab] ?? facts)(user, rest);
  show(h("h1", {}, "User ", h("span", { id: "user-name" }, user)), tabs, content, erase ? h("h2", {}, "Danger zone") : null, erase);
}

function facts(user) {
  const select = h("select", { id: "status-filter", "aria-label": "Status" },
    ["active", "pending", "superseded", "retracted", "expired", "all"].map((s) => h("option", { value: s }, s)));
  const holder = h("div");
  const load = () =>
    holder.replaceChildren(pagedTable(["fact", "type", "status", "created"], `${userPath(user)}/facts`, { status: select.value }, (f) =>
      h("tr", { "data-fact": f.id },
        h("td", { class: "text" }, link(`#/users/${encodeURIComponent(user)}/fact/${encodeURIComponent(f.id)}`, f.text)),
        h("td", {}, f.fact_type), h("td", {}, status(f.status)), h("td", {}, when(f.created_at)))));
  select.addEventListener("change", load);
  load();
  return h("div", {}, h("div", { class: "row" }, h("label", {}, "Status", select)), holder);
}

function factView(user, id) {
  const box = h("div", { class: "card", id: "fact-detail" }, h("p", { class: "muted" }, "Loading…"));
  (async () => {
    try {
      const [fact, history] = await Promise.all([
        api("GET", `${userPath(user)}/facts/${encodeURIComponent(id)}`),
        api("GET", `${userPath(user)}/facts/${encodeURIComponent(id)}/history`),
      ]);
      const factLink = (f) => link(`#/users/${encodeURIComponent(user)}/fact/${encodeURIComponent(f.id)}`, f.text);
      const replaces = (f) => history.items.filter((earlier) => earlier.superseded_by === f.id);
      const actions = [];
      if (can("write") && (fact.status === "active" || fact.status === "superseded")) {
        actions.push(h("button", { type: "button", class: "danger", id: "retract", onclick: () => retract(user, fact) }, "Retract"));
      }
      if (can("write")) {
        actions.push(h("button", { type: "button", class: "danger", id: "forget", onclick: () => forget(user, fact) }, "Forget"));
      }
      box.replaceChildren(
        h("h2", {}, "Fact"),
        h("dl", { class: "fields" },
          h("dt", {}, "text"), h("dd", { id: "fact-text" }, fact.text),
          h("dt", {}, "status"), h("dd", { id: "fact-status" }, status(fact.status)),
          h("dt", {}, "type"), h("dd", {}, fact.fact_type),
          h("dt", {}, "confidence"), h("dd", {}, fact.confidence),
          h("dt", {}, "created"), h("dd", {}, when(fact.created_at)),
          fact.retracted_at ? [h("dt", {}, "retracted"), h("dd", {}, `${when(fact.retracted_at)} ${fact.retraction_reason ?? ""}`)] : null,
          h("dt", {}, "evidence"), h("dd", {}, fact.source_episode_ids.length
            ? fact.source_episode_ids.map((e) => h("div", {}, link(`#/users/${encodeURIComponent(user)}/episodes`, e)))
            : h("span", { class: "muted" }, "none: an explicit write")),
          fact.source_span ? [h("dt", {}, "stated as"), h("dd", {}, fact.source_span)] : null),
        h("h2", {}, "History"),
        h("p", { class: "muted" }, "Oldest first: each value, when Cairn learned it and from which episode, and what replaced it."),
        h("ol", { class: "chain", id: "chain" }, history.items.map((f) =>
          h("li", { class: f.id === fact.id ? "current" : "", "data-fact": f.id },
            status(f.status), " ", factLink(f),
            h("div", { class: "muted" },
              `learned ${when(f.created_at)} `,
              f.source_episode_ids.length ? ["from ", f.source_episode_ids.map((e) => h("code", {}, e))] : "by an explicit write",
              replaces(f).length ? ` — replaces ${replaces(f).map((r) => r.id).join(", ")}` : "",
              f.superseded_at ? ` — superseded ${when(f.superseded_at)}${f.superseded_by ? ` by ${f.superseded_by}` : ""}` : "")))),
        h("div", { class: "row" }, actions));
    } catch (error) {
      box.replaceChildren(failure(error));
    }
  })();
  return box;
}

async function retract(user, fact) {
  const answer = await confirmAction(`Retract "${fact.text}"? It was never true; the value is refused from then on.`, { reason: true });
  if (!answer) return;
  try {
    await api("POST", `${userPath(user)}/facts/${encodeURIComponent(fact.id)}/retract`, answer.reason ? { reason: answer.reason } : {});
    route();
  } catch (error) {
    main.append(failure(error));
  }
}

async function forget(user, fact) {
  if (!(await confirmAction(`Forget "${fact.text}"? It is erased and cannot come back unless the user restates it.`))) return;
  try {
    await api("DELETE", `${userPath(user)}/facts/${encodeURIComponent(fact.id)}`);
    location.hash = `#/users/${encodeURIComponent(user)}/facts`;
  } catch (error) {
    main.append(failure(error));
  }
}

async function eraseUser(user) {
  if (!(await confirmAction(`Erase everything Cairn holds about ${user}? This cannot be undone.`))) return;
  try {
    const receipt = await api("DELETE", userPath(user));
    show(h("h1", {}, `Erased ${user}`), h("div", { class: "card", id: "receipt" },
      h("h2", {}, "Receipt"),
      h("dl", { class: "fields" }, Object.entries(receipt.deleted).map(([kind, count]) => [h("dt", {}, kind), h("dd", {}, count)]))));
  } catch (error) {
    main.append(failure(error));
  }
}

function episodes(user) {
  // Newest first, a page at a time; a session shows its episodes alone.
  const session = h("input", { id: "session-filter", type: "text", placeholder: "every session", "aria-label": "Session" });
  const holder = h("div");
  const load = () =>
    holder.replaceChildren(pagedTable(["said", "session", "when"], `${userPath(user)}/episodes`, { session_id: session.value.trim() }, (e) => {
      const pick = h("button", { type: "button", onclick: () => { session.value = e.session_id ?? ""; load(); } }, e.session_id ?? "—");
      return h("tr", { "data-session": e.session_id ?? "" },
        h("td", { class: "text" }, e.text), h("td", {}, e.session_id ? pick : "—"), h("td", {}, when(e.occurred_at)));
    }));
  session.addEventListener("change", load);
  load();
  return h("div", {}, h("div", { class: "row" }, h("label", {}, "Session", session)), holder);
}

function playbooks(user) {
  return pagedTable(["playbook", "trigger", "version", "outcomes", "steps"], `${userPath(user)}/playbooks`, {}, (p) => {
    const versions = h("td", { class: "text" }, h("ol", {}, p.steps.map((s) => h("li", {}, s))));
    const history = h("button", { type: "button", "aria-label": `Versions of ${p.name}`, onclick: async () => {
      try {
        const answer = await api("GET", `${userPath(user)}/playbooks/${encodeURIComponent(p.id)}/versions`);
        versions.replaceChildren(...answer.versions.map((v) => h("div", { class: "card" },
          h("strong", {}, `v${v.version}`), ` ${when(v.updated_at)} · ${v.success_count} ✓ / ${v.failure_count} ✗`,
          h("ol", {}, v.steps.map((s) => h("li", {}, s))))));
      } catch (error) {
        versions.append(failure(error));
      }
    } }, "versions");
    return h("tr", {},
      h("td", {}, p.name, " ", history), h("td", { class: "text" }, p.trigger), h("td", {}, p.version),
      h("td", {}, `${p.success_count} ✓ / ${p.failure_count} ✗`), versions);
  });
}

function decisions(user) {
  const kinds = ["", "NEW", "UPDATES", "EXTENDS", "DUPLICATE", "DROPPED_UNGROUNDED", "BLOCKED_BY_TOMBSTONE", "TOMBSTONE_LIFTED", "RETRACTED", "FORGOTTEN", "REFUSED"];
  const select = h("select", { id: "kind-filter", "aria-label": "Kind" }, kinds.map((k) => h("option", { value: k }, k || "every kind")));
  const holder = h("div");
  const factHref = (id) => `#/users/${encodeURIComponent(user)}/fact/${encodeURIComponent(id)}`;
  const load = () =>
    holder.replaceChildren(pagedTable(["kind", "gate", "reason", "fact", "cites", "origin", "when", ""], `${userPath(user)}/decisions`, { kind: select.value }, (d) => {
      const cited = [d.fact_id, ...d.target_ids].filter(Boolean);
      const evidence = h("td", { class: "text evidence" });
      const show = h("button", { type: "button", class: "evidence-toggle" }, "Evidence");
      show.addEventListener("click", async () => {
        show.disabled = true;
        evidence.replaceChildren(...await Promise.all(cited.map((id) => evidenceOf(user, id))));
      });
      return h("tr", { "data-kind": d.kind },
        h("td", {}, d.kind), h("td", {}, d.gate), h("td", { class: "text" }, d.reason, evidence),
        h("td", {}, d.fact_id ? link(factHref(d.fact_id), d.fact_id) : "—"),
        h("td", {}, d.target_ids.map((id) => h("div", {}, id.startsWith("fact_") ? link(factHref(id), id) : h("code", {}, id)))),
        h("td", {}, d.origin), h("td", {}, when(d.created_at)), h("td", {}, cited.length ? show : null));
    }));
  select.addEventListener("change", load);
  load();
  return h("div", {}, h("div", { class: "row" }, h("label", {}, "Kind", select)), holder);
}

/** What a decision cites, read through the API: a fact's text and the words it was
 * stated in, or an episode's text. Erased records say so. */
async function evidenceOf(user, id) {
  try {
    if (id.startsWith("epi_")) {
      const episode = await api("GET", `${userPath(user)}/episodes/${encodeURIComponent(id)}`);
      return h("blockquote", { "data-cited": id }, h("span", { class: "muted" }, `episode ${when(episode.occurred_at)}: `), episode.text);
    }
    if (id.startsWith("fact_")) {
      const fact = await api("GET", `${userPath(user)}/facts/${encodeURIComponent(id)}`);
      return h("blockquote", { "data-cited": id }, h("span", { class: "muted" }, `fact (${fact.status}): `), fact.text,
        fact.source_span ? h("div", { class: "muted" }, "stated as: ", fact.source_span) : null);
    }
    return h("blockquote", { "data-cited": id }, id);
  } catch (error) {
    return h("blockquote", { "data-cited": id, class: "muted" }, error.status === 404 ? `${id}: erased` : String(error.message));
  }
}

function tombstones(user) {
  const box = h("div", { id: "tombstones" }, h("p", { class: "muted" }, "Loading…"));
  (async () => {
    try {
      const list = await api("GET", `${userPath(user)}/tombstones`);
      box.replaceChildren(
        h("p", { class: "muted" }, "Values retracted (never true) or forgotten (erased): consolidation refuses them from then on. A forgotten value is not kept, so it cannot be shown."),
        list.items.length
          ? table(["reason", "fact", "since"], list.items.map((t) =>
            h("tr", { "data-tombstone": t.id },
              h("td", {}, status(t.reason)),
              h("td", { class: "text" }, t.reason === "retracted"
                ? link(`#/users/${encodeURIComponent(user)}/fact/${encodeURIComponent(t.fact_id)}`, t.fact_id)
                : h("span", { class: "muted" }, `${t.fact_id} (erased)`)),
              h("td", {}, when(t.created_at)))))
          : h("p", {}, "No tombstones."));
    } catch (error) {
      box.replaceChildren(failure(error));
    }
  })();
  return box;
}

function recall(user) {
  const query = h("input", { id: "recall-query", type: "text", "aria-label": "Query", placeholder: "what to recall" });
  const k = h("input", { id: "recall-k", type: "number", min: "1", max: "100", value: "10", "aria-label": "k" });
  const history = h("input", { id: "recall-history", type: "checkbox" });
  const asOf = h("input", { id: "recall-as-of", type: "datetime-local", "aria-label": "as of" });
  const results = h("div", { id: "recall-results" });
  const form = h("form", { class: "row" },
    h("label", {}, "Query", query), h("label", {}, "k", k),
    h("label", {}, "as of", asOf), h("label", {}, h("span", {}, "include history"), history),
    h("button", { type: "submit", class: "primary" }, "Recall"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!query.value.trim()) return;
    const body = { query: query.value, k: Number(k.value) || 10, explain: true, include_history: history.checked };
    if (asOf.value) body.as_of = new Date(asOf.value).toISOString();
    results.replaceChildren(h("p", { class: "muted" }, "Recalling…"));
    try {
      const answer = await api("POST", `${userPath(user)}/recall`, body);
      const fixed = (value, digits = 3) => (value === null || value === undefined ? "—" : Number(value).toFixed(digits));
      results.replaceChildren(answer.hits.length
        ? table(["#", "tier", "memory", "status", "score", "BM25 rank", "BM25", "kNN rank", "cosine", "fused", "prior", "names", "time", "rerank"],
          answer.hits.map((hit, index) => h("tr", { "data-hit": hit.id },
            h("td", {}, index + 1), h("td", {}, hit.tier), h("td", { class: "text" }, hit.text), h("td", {}, status(hit.status)),
            h("td", {}, fixed(hit.score)), h("td", {}, hit.explain?.bm25_rank ?? "—"), h("td", {}, fixed(hit.explain?.bm25_score)),
            h("td", {}, hit.explain?.knn_rank ?? "—"), h("td", {}, fixed(hit.explain?.knn_similarity)),
            h("td", {}, fixed(hit.explain?.fused_score)), h("td", {}, fixed(hit.explain?.prior)),
            h("td", { class: "name-boost" }, fixed(hit.explain?.name_boost, 2)),
            h("td", { class: "time-boost" }, fixed(hit.explain?.time_boost, 2)),
            h("td", {}, fixed(hit.explain?.rerank_score)))))
        : h("p", { class: "muted" }, "No memories."));
    } catch (error) {
      results.replaceChildren(failure(error));
    }
  });
  return h("div", {}, form, results);
}

function jobs(user) {
  const box = h("div", { id: "jobs" }, h("p", { class: "muted" }, "Loading…"));
  api("GET", `${userPath(user)}/jobs`).then((answer) => {
    const queued = answer.items.filter((j) => j.state === "queued").length;
    box.replaceChildren(
      h("p", {}, `Queue depth ${queued}; dead-lettered ${answer.items.length - queued}.`),
      answer.items.length
        ? table(["job", "state", "attempts", "run after", "last error", ""], answer.items.map((j) =>
          h("tr", {}, h("td", {}, j.id), h("td", {}, j.state), h("td", {}, j.attempts), h("td", {}, when(j.run_after)),
            h("td", { class: "text" }, j.last_error ?? ""),
            h("td", {}, can("write") ? h("button", { type: "button", onclick: async () => {
              try { await api("POST", `${userPath(user)}/jobs/${encodeURIComponent(j.id)}/retry`); route(); }
              catch (error) { box.append(failure(error)); }
            } }, "Retry now") : null))))
        : h("p", { class: "muted" }, "No queued or failed jobs."));
  }, (error) => box.replaceChildren(failure(error)));
  return box;
}

function audit(user) {
  return pagedTable(["when", "action", "by", "targets", "request"], `${userPath(user)}/audit`, {}, (e) =>
    h("tr", {}, h("td", {}, when(e.at)), h("td", {}, e.action), h("td", {}, e.subject), h("td", { class: "text" }, e.target_ids.join(", ")),
      h("td", {}, e.request_id)));
}

// ---------------------------------------------------------------- routing
function route() {
  if (!token()) return signIn();
  header();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "users" && parts[1]) return userView(parts[1], parts[2] ?? "facts", parts[3]);
  return home();
}

/** A login link (`cairn token mint --ui`) carries a one-time ticket in the fragment:
 * it is taken out of the address bar at once and exchanged for a session token, only in
 * a tab that holds no session. A link opened into a signed-in console (a crafted one
 * among them) never switches it to another session: signing out comes first. */
async function redeemTicket() {
  const match = location.hash.match(/^#ticket=([A-Za-z0-9_.-]+)$/);
  if (!match) return;
  history.replaceState(null, "", `${location.pathname}#/`);
  if (token()) return;
  try {
    const response = await fetch("/ui/session", {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify({ ticket: match[1] }),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer?.error?.message ?? `HTTP ${response.status}`);
    sessionStorage.setItem(TOKEN_KEY, answer.token);
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    signIn(`The login link did not work: ${error.message}`);
    return false;
  }
}

async function start() {
  if ((await redeemTicket()) === false) return;
  route();
}

/** Keyboard: 1–9 open a user's sections, "/" goes to the first field of the view,
 * "u" back to the users. Typing in a field is never taken for a shortcut. */
function shortcut(event) {
  if (event.ctrlKey || event.metaKey || event.altKey || !token()) return;
  if (event.target.closest?.("input, textarea, select, dialog")) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const tabs = tabsAllowed();
  if (/^[1-9]$/.test(event.key) && parts[0] === "users" && parts[1] && tabs[Number(event.key) - 1]) {
    location.hash = `#/users/${encodeURIComponent(parts[1])}/${tabs[Number(event.key) - 1][0]}`;
  } else if (event.key === "/") {
    main.querySelector("input, select")?.focus();
  } else if (event.key === "u") {
    location.hash = "#/";
  } else {
    return;
  }
  event.preventDefault();
}

window.addEventListener("keydown", shortcut);
window.addEventListener("hashchange", start);
start();
