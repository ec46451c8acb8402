//! What an agent is: its definition and model configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::transcript::Json;

/// Which model a loop talks to, and with which parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// The provider (driver) name, e.g. `openai`, `anthropic`, `scripted`.
    pub provider: String,
    /// The model id at that provider.
    pub model: String,
    /// Provider parameters (temperature, max tokens, ...).
    pub params: BTreeMap<String, Json>,
}

impl ModelConfig {
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        ModelConfig {
            provider: provider.into(),
            model: model.into(),
            params: BTreeMap::new(),
        }
    }

    /// Adds a parameter.
    pub fn with_param(mut self, key: impl Into<String>, value: impl Into<Json>) -> Self {
        self.params.insert(key.into(), value.into());
        self
    }

    /// `provider/model`, the form recorded on assistant messages.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// Resource limits of one execution. `None` means unlimited; enforcing
/// them is the agent loop's job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    /// Maximum loop steps (model turns) per execution.
    pub max_steps: Option<u32>,
    /// Maximum total tokens per execution.
    pub max_tokens: Option<u64>,
    /// Maximum wall-clock time per execution, in milliseconds.
    pub max_duration_ms: Option<u64>,
}

/// What an agent is: name, prompt, model, capabilities, tools, budget.
///
/// A session keeps the definition it was created with; the mutable
/// per-session settings (system prompt, model) live in
/// [`crate::session::AgentState`] and are initialised from here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentDefinition {
    pub name: String,
    pub description: String,
    pub system_prompt: String,
    /// Display label for sessions of this agent; `None` falls back to `name`.
    pub label: Option<String>,
    pub model: ModelConfig,
    /// Named capabilities the loop factory should enable.
    pub capabilities: Vec<String>,
    /// Names of tools the agent may call.
    pub tools: Vec<String>,
    pub budget: Budget,
    pub metadata: BTreeMap<String, Json>,
}

impl AgentDefinition {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        system_prompt: impl Into<String>,
    ) -> Self {
        AgentDefinition {
            name: name.into(),
            description: description.into(),
            system_prompt: system_prompt.into(),
            ..Default::default()
        }
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn with_model(mut self, model: ModelConfig) -> Self {
        self.model = model;
        self
    }

    pub fn with_tools<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tools = tools.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_capabilities<I, S>(mut self, capabilities: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.capabilities = capabilities.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The label sessions of this agent get: the explicit label, or the
    /// name when the label is absent or empty.
    pub fn effective_label(&self) -> String {
        match &self.label {
            Some(l) if !l.is_empty() => l.clone(),
            _ => self.name.clone(),
        }
    }
}
