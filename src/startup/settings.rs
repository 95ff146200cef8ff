//! The banner lines that state the settings an operator chose: authentication, the audit log,
//! the tool-call and reasoning parsers and who may read `/metrics`.

use crate::server::openai::tools::ToolCallFormat;
use crate::server::{ModelService, Server};

/// The banner lines that state authentication, the audit log, the tool-call parser and who may
/// read `/metrics`, from the configuration in force on `server` and the loaded `service`.
pub(super) fn banner_lines(server: &Server, service: &ModelService) -> String {
    let config = server.app().config();
    let auth = match config.auth.keys.len() {
        0 => "off (no API keys: loopback only)".to_owned(),
        n => format!("on ({n} API key{})", if n == 1 { "" } else { "s" }),
    };
    let audit = match &config.audit {
        Some(audit) => format!("on ({})", audit.dir.display()),
        None => "off (no [audit] table: nothing is recorded)".to_owned(),
    };
    let parser = |format: ToolCallFormat| match format {
        ToolCallFormat::Llama3Json => "llama3_json",
        ToolCallFormat::Hermes => "hermes",
        ToolCallFormat::Mistral => "mistral",
        ToolCallFormat::Harmony => "harmony",
    };
    let tools = match (config.server.tool_call_parser, service.tool_call_format()) {
        (Some(format), _) => format!("{} (configured)", parser(format)),
        (None, Some(format)) => format!("{} (detected from the chat template)", parser(format)),
        (None, None) => "none".to_owned(),
    };
    let reasoning = match (config.server.reasoning_parser, service.reasoning_format()) {
        (Some(format), _) => format!("{} (configured)", format.name()),
        (None, Some(format)) => format!("{} (detected from the chat template)", format.name()),
        (None, None) => "none".to_owned(),
    };
    let metrics = &config.metrics;
    let metrics = match (metrics.key_sha256.is_some(), metrics.public) {
        (true, true) => "public; the scrape key adds per-principal series",
        (true, false) => "scrape key",
        (false, true) => "public",
        (false, false) => match config.attestation.profile {
            crate::config::AttestationProfile::Development => "API keys",
            crate::config::AttestationProfile::Production => "off",
        },
    };
    format!(
        "\n  auth:        {auth}\n  audit:       {audit}\n  tool parser: {tools}\n  reasoning:   {reasoning}\n  metrics:     {metrics}"
    )
}
