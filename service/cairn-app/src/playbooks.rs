//! Playbooks: reusable procedures, versioned, with outcome counts.

use crate::{Cairn, RequestContext, audit_event, now, validate};
use cairn_core::{Change, ChangeSet, Error, Page, PageRequest, Playbook, Result, Scope, new_id};

#[derive(Clone, Debug)]
pub struct PlaybookInput {
    pub name: String,
    pub trigger: String,
    pub steps: Vec<String>,
}

/// A new version; omitted name or trigger carry over from the current version.
#[derive(Clone, Debug)]
pub struct PlaybookVersionInput {
    pub name: Option<String>,
    pub trigger: Option<String>,
    pub steps: Vec<String>,
    /// When set, the write succeeds only if the playbook is still at this version.
    pub base_version: Option<u32>,
}

impl Cairn {
    /// A validated, embedded first version (not yet stored).
    pub(crate) async fn new_playbook(
        &self,
        name: String,
        trigger: String,
        steps: Vec<String>,
    ) -> Result<Playbook> {
        let limit = self.settings.max_text_chars;
        let at = now();
        let mut playbook = Playbook {
            id: new_id("pb"),
            name: validate::text("name", &name, limit.min(200))?,
            trigger: validate::text("trigger", &trigger, limit)?,
            steps: self.validated_steps(&steps)?,
            version: 1,
            success_count: 0,
            failure_count: 0,
            created_at: at,
            updated_at: at,
            last_used_at: None,
            use_count: 0,
            embedding: None,
        };
        playbook.embedding = self.embed_one(&playbook.searchable_text()).await?;
        Ok(playbook)
    }

    fn validated_steps(&self, steps: &[String]) -> Result<Vec<String>> {
        validate::steps("steps", steps, self.settings.max_text_chars)
    }

    pub async fn create_playbook(
        &self,
        scope: &Scope,
        context: &RequestContext,
        input: PlaybookInput,
    ) -> Result<Playbook> {
        let playbook = self.new_playbook(input.name, input.trigger, input.steps).await?;
        let event = audit_event(
            scope,
            context,
            "playbook.create",
            vec![playbook.id.clone()],
            serde_json::json!({ "version": 1 }),
        );
        self.store
            .commit(
                scope,
                ChangeSet::new(event).with(Change::InsertPlaybook(playbook.clone())),
            )
            .await?;
        Ok(playbook)
    }

    /// Adds a version; the previous versions stay readable and unchanged.
    pub async fn new_playbook_version(
        &self,
        scope: &Scope,
        context: &RequestContext,
        playbook_id: &str,
        input: PlaybookVersionInput,
    ) -> Result<Playbook> {
        let limit = self.settings.max_text_chars;
        let current = self.get_playbook(scope, playbook_id).await?;
        if let Some(base_version) = input.base_version
            && base_version != current.version
        {
            return Err(Error::Conflict {
                code: cairn_core::ErrorCode::VersionConflict,
                message: format!(
                    "playbook {playbook_id} is at version {}, not {base_version}",
                    current.version
                ),
            });
        }
        let mut next = Playbook {
            name: match &input.name {
                Some(name) => validate::text("name", name, limit.min(200))?,
                None => current.name.clone(),
            },
            trigger: match &input.trigger {
                Some(trigger) => validate::text("trigger", trigger, limit)?,
                None => current.trigger.clone(),
            },
            steps: self.validated_steps(&input.steps)?,
            version: current.version + 1,
            updated_at: now(),
            embedding: None,
            ..current.clone()
        };
        next.embedding = self.embed_one(&next.searchable_text()).await?;
        let event = audit_event(
            scope,
            context,
            "playbook.version",
            vec![next.id.clone()],
            serde_json::json!({ "version": next.version }),
        );
        self.store
            .commit(
                scope,
                ChangeSet::new(event).with(Change::AppendPlaybookVersion {
                    expected_version: current.version,
                    playbook: next.clone(),
                }),
            )
            .await?;
        Ok(next)
    }

    pub async fn record_playbook_outcome(
        &self,
        scope: &Scope,
        context: &RequestContext,
        playbook_id: &str,
        success: bool,
    ) -> Result<Playbook> {
        let playbook = self.get_playbook(scope, playbook_id).await?;
        let event = audit_event(
            scope,
            context,
            "playbook.outcome",
            vec![playbook.id.clone()],
            serde_json::json!({ "success": success }),
        );
        self.store
            .commit(
                scope,
                ChangeSet::new(event).with(Change::RecordPlaybookOutcome {
                    playbook_id: playbook.id.clone(),
                    success,
                    at: now(),
                }),
            )
            .await?;
        self.get_playbook(scope, playbook_id).await
    }

    pub async fn get_playbook(&self, scope: &Scope, playbook_id: &str) -> Result<Playbook> {
        self.store
            .get_playbook(scope, playbook_id)
            .await?
            .ok_or(Error::NotFound { what: "playbook" })
    }

    pub async fn playbook_versions(&self, scope: &Scope, playbook_id: &str) -> Result<Vec<Playbook>> {
        let versions = self.store.playbook_versions(scope, playbook_id).await?;
        if versions.is_empty() {
            return Err(Error::NotFound { what: "playbook" });
        }
        Ok(versions)
    }

    pub async fn list_playbooks(&self, scope: &Scope, page: &PageRequest) -> Result<Page<Playbook>> {
        self.store.list_playbooks(scope, page).await
    }
}
