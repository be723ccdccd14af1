//! The hosted MCP endpoint: `/mcp`, streamable HTTP through rmcp, on the same port,
//! auth check and middlewares as REST. Each tool calls the same use-case function as
//! its REST route and reports errors with the same codes.

use crate::error::ApiError;
use crate::http::{AppState, Authenticated, authenticate};
use crate::wire;
use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};
use cairn_app::{AnswerRequest, Cairn, ProfileRequest, RecallRequest, RequestContext as CallContext};
use cairn_core::{Error, Permission, Principal, Scope};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation,
    ListPromptsResult, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage, Role,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use rmcp_actix_web::transport::{LocalSessionManager, StreamableHttpService, on_request_extensions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// The authenticated caller of one MCP request, handed from the auth middleware to the
/// tools through the request extensions.
#[derive(Clone)]
pub struct McpCaller {
    principal: Principal,
    context: CallContext,
}

impl McpCaller {
    /// The scope a tool acts in: the token's bound user, or the `user` argument when the
    /// token is not bound (then required).
    fn scope(&self, user: Option<&str>, permission: Permission) -> Result<Scope, ApiError> {
        let user = match (user, self.principal.bound_user()) {
            (Some(user), _) => user.to_owned(),
            (None, Some(bound)) => bound.as_str().to_owned(),
            (None, None) => {
                return Err(
                    Error::invalid("user", "is required when the token is not bound to a user").into(),
                );
            }
        };
        Ok(self.principal.scope_for(&user, permission)?)
    }
}

/// Authenticates every request to `/mcp` before any MCP message is read. A token
/// without any memory scope is refused here; each tool then checks the scope it needs.
pub async fn authenticate_mcp(
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    match authenticate(request.request()).await {
        Ok(Authenticated { principal, context }) => {
            if ![Permission::Read, Permission::Write]
                .into_iter()
                .any(|permission| principal.has(permission))
            {
                let refused = ApiError::from(Error::Forbidden {
                    code: cairn_core::ErrorCode::InsufficientScope,
                    message: "the MCP endpoint needs a memory scope".into(),
                });
                return Ok(request.error_response(refused));
            }
            request.extensions_mut().insert(McpCaller { principal, context });
            next.call(request).await
        }
        Err(error) => Ok(request.error_response(error)),
    }
}

/// The rmcp transport, configured from the service settings. Stateless: every POST
/// carries its own token, so no session outlives its request.
pub fn service(
    cairn: Cairn,
    max_body_bytes: usize,
    allowed_hosts: Option<Vec<String>>,
) -> StreamableHttpService<CairnMcp> {
    StreamableHttpService::builder()
        .service_factory(Arc::new(move || Ok(CairnMcp::new(cairn.clone()))))
        .session_manager(Arc::new(LocalSessionManager::default()))
        .stateful_mode(false)
        .json_response(true)
        .max_request_body_bytes(max_body_bytes)
        .maybe_allowed_hosts(allowed_hosts)
        .on_request_fn(|request, extensions| {
            if let Some(caller) = request.extensions().get::<McpCaller>() {
                extensions.insert(caller.clone());
            }
        })
        .build()
}

/// Mounts `/mcp` behind the authentication middleware.
pub fn register(config: &mut web::ServiceConfig, state: &AppState) {
    config.service(
        state
            .mcp
            .clone()
            .scope_with_path("/mcp")
            .wrap(actix_web::middleware::from_fn(authenticate_mcp)),
    );
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    /// What to look for, in natural language.
    pub query: String,
    /// How many memories to return (default 10).
    pub k: Option<usize>,
    /// Any of semantic, episodic, procedural (default all).
    pub tiers: Option<Vec<String>>,
    /// Also return superseded facts, marked as such.
    pub include_history: Option<bool>,
    /// Also return facts held for a person's review, marked pending.
    pub include_pending: Option<bool>,
    /// What held in the world at this RFC 3339 time (event time), superseded since or not.
    pub valid_at: Option<String>,
    /// Only memories about this person, pet, place or organisation ("Anna", "my sister").
    pub entity: Option<String>,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EntityArgs {
    /// The entity's name or relation ("Anna", "my sister") or id.
    pub name: String,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerArgs {
    /// The question about the user, in natural language.
    pub query: String,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// One short, self-contained statement about the user.
    pub text: String,
    /// identity, preference, constraint, world or event.
    pub fact_type: Option<String>,
    /// The id of the fact this one replaces.
    pub supersedes: Option<String>,
    /// natural (the old value stopped being true) or harsh (it was never true).
    pub contradiction: Option<String>,
    /// RFC 3339 time from which the statement holds, when the user dated it.
    pub valid_from: Option<String>,
    /// RFC 3339 time until which the statement holds, when the user dated it.
    pub valid_to: Option<String>,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryIdArgs {
    /// The memory id.
    pub id: String,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetractArgs {
    /// The fact id.
    pub id: String,
    /// Why it was never true.
    pub reason: Option<String>,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileArgs {
    /// Also recall memories relevant to this text.
    pub query: Option<String>,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeArgs {
    /// The playbook id.
    pub id: String,
    /// Whether following the playbook worked.
    pub success: bool,
    /// The user, when the token is not bound to one.
    pub user: Option<String>,
}

/// The MCP server: tools over the same use cases as the REST routes.
#[derive(Clone)]
pub struct CairnMcp {
    cairn: Cairn,
    #[allow(
        dead_code,
        reason = "read through Self::tool_router() by the tool_handler macro"
    )]
    tool_router: ToolRouter<CairnMcp>,
}

fn caller(context: &RequestContext<RoleServer>) -> Result<McpCaller, McpError> {
    on_request_extensions(&context.extensions)
        .and_then(|extensions| extensions.get::<McpCaller>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request carries no authenticated caller", None))
}

/// Renders a use-case outcome as a tool result: the REST response type as structured
/// content plus a short text, or a tool error carrying the REST error body (same codes,
/// reported and logged by the same function as REST errors).
fn finish<T: Serialize>(outcome: Result<(T, String), ApiError>, caller: &McpCaller) -> CallToolResult {
    let failed = |error: ApiError| {
        let (_, body) = error.report(&caller.context.request_id);
        let text = format!("error {}: {}", body.error.code, body.error.message);
        let mut result = CallToolResult::structured_error(serde_json::to_value(&body).unwrap_or(Value::Null));
        result.content = vec![ContentBlock::text(text)];
        result
    };
    match outcome {
        Ok((response, summary)) => match serde_json::to_value(&response) {
            Ok(value) => {
                let mut result = CallToolResult::structured(value);
                result.content = vec![ContentBlock::text(summary)];
                result
            }
            Err(error) => failed(ApiError::Core(Error::Storage(format!(
                "a tool result could not be rendered: {error}"
            )))),
        },
        Err(error) => failed(error),
    }
}

/// A prompt request's failure as an MCP error, reported like every other error:
/// the caller's mistakes as invalid parameters, the server's as internal errors.
fn prompt_error(error: ApiError, caller: &McpCaller) -> McpError {
    let (status, body) = error.report(&caller.context.request_id);
    let data = serde_json::to_value(&body).ok();
    if status.is_client_error() {
        McpError::invalid_params(body.error.message, data)
    } else {
        McpError::internal_error(body.error.message, data)
    }
}

fn numbered(lines: impl Iterator<Item = String>) -> String {
    let lines: Vec<String> = lines
        .enumerate()
        .map(|(index, line)| format!("{}. {line}", index + 1))
        .collect();
    if lines.is_empty() {
        "No memories found.".to_owned()
    } else {
        lines.join("\n")
    }
}

#[tool_router]
impl CairnMcp {
    pub fn new(cairn: Cairn) -> Self {
        CairnMcp {
            cairn,
            tool_router: Self::tool_router(),
        }
    }

    /// Every tool as `tools/list` describes it (for the reference page).
    pub fn tools() -> Vec<rmcp::model::Tool> {
        Self::tool_router().list_all()
    }

    /// Every prompt as `prompts/list` describes it.
    pub fn prompts() -> Vec<Prompt> {
        let mut query = PromptArgument::new("query");
        query.description = Some("Also include memories relevant to this text".into());
        query.required = Some(false);
        let mut user = PromptArgument::new("user");
        user.description = Some("The user, when the token is not bound to one".into());
        user.required = Some(false);
        vec![Prompt::new(
            CONTEXT_PROMPT,
            Some("What Cairn knows about the user, as a block to put at the start of a conversation"),
            Some(vec![query, user]),
        )]
    }

    #[tool(
        description = "Recall the memories (facts, episodes, playbooks) most relevant to a query. Only current facts unless include_history is set.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn recall_memory(
        &self,
        Parameters(args): Parameters<RecallArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Read)?;
            let mut request = RecallRequest::new(args.query);
            request.k = args.k;
            request.tiers = wire::parse_tiers(args.tiers.as_deref())?;
            request.include_history = args.include_history.unwrap_or(false);
            request.include_pending = args.include_pending.unwrap_or(false);
            request.valid_at = wire::utc("valid_at", args.valid_at.as_deref())?;
            request.entity = args.entity;
            let result = self.cairn.recall(&scope, request).await?;
            let summary = numbered(result.hits.iter().map(|hit| {
                let text = wire::recall_hit(hit).text;
                format!(
                    "[{} {} {}] {text}",
                    hit.memory.tier().as_str(),
                    hit.status.as_str(),
                    hit.memory.id()
                )
            }));
            Ok((wire::recall_response(&result), summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "What is known about one person, pet, place or organisation the user has named (\"Anna\", \"my sister\"): its current facts and their history.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_entity(
        &self,
        Parameters(args): Parameters<EntityArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Read)?;
            let entity = self.cairn.entity(&scope, &args.name).await?;
            let summary = format!(
                "{} ({}; also {}): {}",
                entity.name,
                entity.kind.as_str(),
                entity.aliases.join(", "),
                numbered(entity.facts.iter().map(|fact| fact.text.clone()))
            );
            Ok((wire::entity(&entity), summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "Answer a question about the user from memory alone. Returns the answer with the ids of the memories that support it, or known: false when the memories do not say (then do not guess).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn answer_from_memory(
        &self,
        Parameters(args): Parameters<AnswerArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Read)?;
            let request = AnswerRequest {
                query: args.query,
                as_of: None,
            };
            let answer = self.cairn.answer(&scope, request).await?;
            let summary = if answer.known {
                format!("{} (cited: {})", answer.answer, answer.citations.join(", "))
            } else {
                "Not known from memory.".to_owned()
            };
            Ok((wire::answer_response(answer), summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "Save one fact about the user. Pass supersedes with an old fact's id to replace it: contradiction natural keeps the old one as history, harsh retracts it.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn write_memory(
        &self,
        Parameters(args): Parameters<WriteArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Write)?;
            let input = wire::FactBody {
                text: args.text,
                fact_type: args.fact_type,
                confidence: None,
                supersedes: args.supersedes,
                contradiction: args.contradiction,
                valid_from: args.valid_from,
                valid_to: args.valid_to,
                expires_at: None,
                reassert: false,
                evidence_episode_id: None,
                review: false,
            }
            .into_input()?;
            let outcome = self.cairn.write_fact(&scope, &caller.context, input).await?;
            let summary = format!(
                "{} {}: {}",
                outcome.decision.kind.as_str(),
                outcome.fact.id,
                outcome.fact.text
            );
            Ok((wire::fact_write_response(&outcome), summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "Forget (erase) one fact by id. The value cannot come back unless the user restates it.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn forget_memory(
        &self,
        Parameters(args): Parameters<MemoryIdArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Write)?;
            self.cairn.forget_fact(&scope, &caller.context, &args.id).await?;
            let summary = format!("Forgot {}.", args.id);
            Ok((wire::Forgotten { forgotten: args.id }, summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "Retract a fact that was never true. It stays recorded as retracted and its value is refused from then on.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn retract_memory(
        &self,
        Parameters(args): Parameters<RetractArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Write)?;
            let fact = self
                .cairn
                .retract_fact(&scope, &caller.context, &args.id, args.reason)
                .await?;
            let summary = format!("Retracted {}: {}", fact.id, fact.text);
            Ok((
                wire::FactEnvelope {
                    fact: wire::fact(&fact, chrono::Utc::now()),
                },
                summary,
            ))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "The user's profile: lasting facts, recent facts and, with a query, relevant memories, plus a ready-made context block.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_profile(
        &self,
        Parameters(args): Parameters<ProfileArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Read)?;
            let request = ProfileRequest {
                query: args.query,
                ..ProfileRequest::default()
            };
            let profile = self.cairn.profile(&scope, request).await?;
            let summary = if profile.context.is_empty() {
                "Nothing is known about the user yet.".to_owned()
            } else {
                profile.context.clone()
            };
            Ok((wire::profile(&profile), summary))
        }
        .await;
        Ok(finish(outcome, &caller))
    }

    #[tool(
        description = "Record whether following a playbook worked.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_playbook_outcome(
        &self,
        Parameters(args): Parameters<OutcomeArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let caller = caller(&context)?;
        let outcome = async {
            let scope = caller.scope(args.user.as_deref(), Permission::Write)?;
            let playbook = self
                .cairn
                .record_playbook_outcome(&scope, &caller.context, &args.id, args.success)
                .await?;
            let summary = format!(
                "{} v{}: {} successes, {} failures",
                playbook.name, playbook.version, playbook.success_count, playbook.failure_count
            );
            Ok((
                wire::PlaybookEnvelope {
                    playbook: wire::playbook(&playbook),
                },
                summary,
            ))
        }
        .await;
        Ok(finish(outcome, &caller))
    }
}

const CONTEXT_PROMPT: &str = "context";

#[tool_handler]
impl ServerHandler for CairnMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_prompts()
                .enable_tools()
                .build(),
        )
        .with_server_info(Implementation::new("cairn", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Cairn is this user's long-term memory. Call get_profile (or use the context prompt) at the \
                 start of a conversation, recall_memory before answering questions about the user, and \
                 write_memory when the user states a lasting fact about themselves.",
        )
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(CairnMcp::prompts()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != CONTEXT_PROMPT {
            return Err(McpError::invalid_params(
                format!("unknown prompt {:?}", request.name),
                None,
            ));
        }
        let caller = caller(&context)?;
        let argument = |name: &str| {
            request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get(name))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let scope = caller
            .scope(argument("user").as_deref(), Permission::Read)
            .map_err(|error| prompt_error(error, &caller))?;
        let profile = self
            .cairn
            .profile(
                &scope,
                ProfileRequest {
                    query: argument("query"),
                    ..ProfileRequest::default()
                },
            )
            .await
            .map_err(|error| prompt_error(error.into(), &caller))?;
        let text = if profile.context.is_empty() {
            "Nothing is known about the user yet.".to_owned()
        } else {
            profile.context
        };
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("What Cairn knows about the user")
                .into(),
        )
    }
}
