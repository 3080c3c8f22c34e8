use std::sync::Mutex;

use super::*;
use crate::agent::model::scripted::ScriptedModel;

fn thread() -> ThreadState {
    ThreadState::new("t1".to_owned(), "api:c1".to_owned(), 0, 1)
}

fn runtime(model: Arc<ScriptedModel>, max_model_calls: u32) -> Runtime {
    Runtime::new(
        model,
        ToolRegistry::builtin(),
        MiddlewareChain::default(),
        "be brief".to_owned(),
        max_model_calls,
    )
}

#[derive(Default)]
struct Recorder {
    deltas: Mutex<Vec<String>>,
    checkpoints: Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl RunObserver for Recorder {
    fn delta(&self, text: &str) {
        self.deltas.lock().unwrap().push(text.to_owned());
    }

    async fn checkpoint(&self, thread: &mut ThreadState) {
        self.checkpoints.lock().unwrap().push(thread.messages.len());
    }
}

#[tokio::test]
async fn plain_answer_appends_user_and_assistant_messages() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedModel::text("hello")]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, "api:u1", "hi", &recorder)
        .await
        .unwrap();
    assert_eq!(outcome.answer, "hello");
    assert_eq!(outcome.model_calls, 1);
    assert_eq!(
        thread.messages,
        vec![ChatMessage::user("hi"), ChatMessage::assistant("hello")]
    );
    assert_eq!(thread.turns, 1);
    assert_eq!(*recorder.deltas.lock().unwrap(), vec!["hello"]);
    let sent = &model.requests()[0];
    assert_eq!(sent.messages[0], ChatMessage::system("be brief"));
    assert!(sent.tools.iter().any(|t| t.name == "current_time"));
}

#[tokio::test]
async fn tool_calls_run_and_their_results_go_back_to_the_model() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedModel::calls(&[("c1", "current_time", "{}"), ("c2", "nope", "{}")]),
        ScriptedModel::text("it is late"),
    ]));
    let mut thread = thread();
    let recorder = Recorder::default();
    let outcome = runtime(model.clone(), 5)
        .run(&mut thread, "api:u1", "time?", &recorder)
        .await
        .unwrap();
    assert_eq!(outcome.answer, "it is late");
    // user, assistant(tool_calls), tool, tool, assistant
    assert_eq!(thread.messages.len(), 5);
    let ChatMessage::Tool {
        tool_call_id,
        content,
    } = &thread.messages[2]
    else {
        panic!("expected a tool result")
    };
    assert_eq!(tool_call_id, "c1");
    assert!(
        content.contains("UTC") || content.contains('T'),
        "{content}"
    );
    let ChatMessage::Tool { content, .. } = &thread.messages[3] else {
        panic!("expected a tool result")
    };
    assert!(content.contains("no tool named `nope`"), "{content}");
    // The second request carries both results, and the thread was checkpointed after them.
    assert_eq!(model.requests()[1].messages.len(), 1 + 4);
    assert_eq!(*recorder.checkpoints.lock().unwrap(), vec![4]);
}

#[tokio::test]
async fn the_model_call_cap_forces_an_answer() {
    let call = || ScriptedModel::calls(&[("c", "current_time", "{}")]);
    let model = Arc::new(ScriptedModel::new(vec![call(), call(), call()]));
    let mut thread = thread();
    let outcome = runtime(model.clone(), 2)
        .run(&mut thread, "api:u1", "loop", &Unobserved)
        .await
        .unwrap();
    assert_eq!(outcome.model_calls, 2);
    assert_eq!(outcome.stop_reason.as_deref(), Some("iteration_limit"));
    assert!(
        outcome.answer.contains("stopped after 2 steps"),
        "{}",
        outcome.answer
    );
    let Some(ChatMessage::Assistant { tool_calls, .. }) = thread.messages.last() else {
        panic!("expected a final assistant message")
    };
    assert!(tool_calls.is_empty());
}

#[tokio::test]
async fn a_model_failure_is_an_error_and_keeps_the_user_message() {
    let model = Arc::new(ScriptedModel::new(vec![Err(ModelError::Unauthorized {
        status: 401,
        detail: String::new(),
    })]));
    let mut thread = thread();
    let error = runtime(model, 5)
        .run(&mut thread, "api:u1", "hi", &Unobserved)
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        RunError::Model(ModelError::Unauthorized { .. })
    ));
    assert_eq!(thread.messages, vec![ChatMessage::user("hi")]);
    assert_eq!(thread.turns, 0);
}
