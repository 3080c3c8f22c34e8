//! A small MCP server on stdio for antler's tests: `add(a, b)`, `echo(text)`, `fail()` (a
//! tool-level error naming the `MCP_TEST_SECRET` environment variable's value, which antler
//! must mask), `picture()` (an image, which antler describes instead of passing on) and
//! `big(bytes)` (a text of that many bytes, for the message limit).
//!
//! Arguments: `--tag <anything>` is ignored (tests find their server's process by it);
//! `--token <value>` names a token; `--refuse` makes it refuse to start, writing why (the
//! token included) to stderr; `--refuse-if <path>` makes it refuse while that file exists.
//! `cargo test` builds it; the tests find it at `target/<profile>/examples/mcp_test_server`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

struct TestServer;

fn schema(value: serde_json::Value) -> Arc<JsonObject> {
    match value {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "add",
            "Add two numbers and return their sum.",
            schema(json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]
            })),
        ),
        Tool::new(
            "echo",
            "Echo the given text back unchanged.",
            schema(json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            })),
        ),
        Tool::new("fail", "Always fails.", schema(json!({"type": "object"}))),
        Tool::new(
            "picture",
            "Returns a tiny picture.",
            schema(json!({"type": "object"})),
        ),
        Tool::new(
            "big",
            "Returns a text of the given number of bytes.",
            schema(json!({
                "type": "object",
                "properties": {"bytes": {"type": "integer"}},
                "required": ["bytes"]
            })),
        ),
    ]
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "add" => {
                let a = arguments.get("a").and_then(|v| v.as_f64()).unwrap_or(0.0);
                let b = arguments.get("b").and_then(|v| v.as_f64()).unwrap_or(0.0);
                CallToolResult::success(vec![ContentBlock::text(format!("{}", a + b))])
            }
            "echo" => {
                let text = arguments
                    .get("text")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                CallToolResult::success(vec![ContentBlock::text(text.to_owned())])
            }
            "fail" => {
                let secret = std::env::var("MCP_TEST_SECRET").unwrap_or_default();
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "backend refused the token {secret}"
                ))])
            }
            "big" => {
                let bytes = arguments.get("bytes").and_then(|v| v.as_u64()).unwrap_or(0);
                CallToolResult::success(vec![ContentBlock::text("x".repeat(bytes as usize))])
            }
            "picture" => CallToolResult::success(vec![
                ContentBlock::text("here it is"),
                ContentBlock::image("iVBORw0KGgo=", "image/png"),
            ]),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

/// The value after `flag` among the arguments.
fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let refuse_if = arg("--refuse-if").filter(|path| std::path::Path::new(path).exists());
    if std::env::args().any(|a| a == "--refuse") || refuse_if.is_some() {
        let token = arg("--token").unwrap_or_default();
        eprintln!("refusing to start: the token {token} was rejected");
        std::process::exit(1);
    }
    let service = TestServer
        .serve(rmcp::transport::stdio())
        .await
        .expect("serve on stdio");
    let _ = service.waiting().await;
}
