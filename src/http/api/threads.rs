//! `GET /api/v1/threads/{id}` (the thread as the API shows it), `.../events` (its live
//! events) and `.../files/{name}` (a presented file), each under the thread's access rule.

use super::*;

/// Every event of a thread until the client goes away (or shutdown).
fn thread_stream(
    events: Subscription,
    stop: CancellationToken,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((events, permit), move |(mut events, permit)| {
        let stop = stop.clone();
        async move {
            loop {
                let next = tokio::select! {
                    next = events.recv() => next,
                    () = stop.cancelled() => return None,
                };
                match next {
                    Ok(event) => return Some((Ok(sse_event(&event)), (events, permit))),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

/// Which message carried which presented files: for each presentation, the first answer
/// (an assistant message without tool calls) after the result of its `present_files` call.
fn attachments_by_message(thread: &ThreadState) -> Vec<(usize, Vec<FileLink>)> {
    let Some(presented) = thread.extensions.get::<PresentedFiles>() else {
        return Vec::new();
    };
    let mut found: Vec<(usize, Vec<FileLink>)> = Vec::new();
    for entry in presented.entries {
        let Some(result) = thread.messages.iter().position(|m| {
            matches!(m, ChatMessage::Tool { tool_call_id, .. } if *tool_call_id == entry.call_id)
        }) else {
            continue;
        };
        let Some(answer) = thread
            .messages
            .iter()
            .enumerate()
            .skip(result + 1)
            .find(|(_, m)| {
                matches!(m, ChatMessage::Assistant { tool_calls, .. } if tool_calls.is_empty())
            })
            .map(|(index, _)| index)
        else {
            continue;
        };
        let links = entry.files.into_iter().map(|file| FileLink {
            url: file_url(&thread.id, &file.name),
            name: file.name,
            media_type: file.media_type,
            size: file.size,
        });
        match found.iter_mut().find(|(index, _)| *index == answer) {
            Some((_, existing)) => {
                for link in links {
                    if !existing.iter().any(|l| l.name == link.name) {
                        existing.push(link);
                    }
                }
            }
            None => found.push((answer, links.collect())),
        }
    }
    found
}

/// The thread as the API shows it: its metadata and messages, those of failed turns marked
/// `"failed": true`, answers that carried files with their `attachments`.
fn thread_view(thread: &ThreadState) -> Value {
    let mut view = serde_json::to_value(thread).unwrap_or_else(|_| json!({}));
    let attachments = attachments_by_message(thread);
    let messages: Vec<Value> = thread
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let mut value = serde_json::to_value(message).unwrap_or(Value::Null);
            if let Some(object) = value.as_object_mut() {
                if thread.is_failed(index) {
                    object.insert("failed".to_owned(), Value::Bool(true));
                }
                if let Some((_, links)) = attachments.iter().find(|(at, _)| *at == index) {
                    object.insert("attachments".to_owned(), json!(links));
                }
            }
            value
        })
        .collect();
    if let Some(object) = view.as_object_mut() {
        object.insert("messages".to_owned(), Value::Array(messages));
    }
    view
}

/// The thread `id` if it exists and `principal` may read it (404 otherwise, so a user cannot
/// tell another's thread ids from unknown ones).
async fn readable_thread(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<ThreadState, ApiError> {
    match state.store.thread(id).await? {
        Some(thread) if principal.may_read(&thread.conversation) => Ok(thread),
        _ => Err(ApiError::NotFound(format!("no thread `{id}`"))),
    }
}

/// `GET /api/v1/threads/{id}`
pub(crate) async fn get_thread(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let thread = readable_thread(&state, &principal, &id).await?;
    Ok(Json(thread_view(&thread)).into_response())
}

/// A file name safe inside a quoted `Content-Disposition` `filename`: printable ASCII
/// without quotes or backslashes (the exact name goes in `filename*`).
pub(super) fn ascii_file_name(name: &str) -> String {
    let base = safe_file_name(name).unwrap_or_else(|| "file".to_owned());
    base.chars()
        .map(|c| {
            if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Why a file cannot be downloaded: all of it is "not found", so a client cannot probe
/// what exists outside the thread's outputs.
fn no_file(name: &str) -> ApiError {
    let shown: String = name.chars().take(200).collect();
    ApiError::NotFound(format!("no file `{shown}` in this thread's outputs"))
}

/// `GET /api/v1/threads/{id}/files/{*name}`: a file of the thread's outputs folder.
pub(crate) async fn get_file(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath((id, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    readable_thread(&state, &principal, &id).await?;
    file_response(&state, &id, &name).await
}

/// File `name` of thread `id`'s outputs folder as a download (the caller checked that the
/// thread may be read): 404 for anything but a regular file beneath the outputs.
pub(crate) async fn file_response(
    state: &AppState,
    id: &str,
    name: &str,
) -> Result<Response, ApiError> {
    let folders = ThreadFolders::new(&state.data_root, id).map_err(|_| no_file(name))?;
    let max_bytes = state.max_attachment_bytes;
    let virtual_path = format!("{}/{name}", Area::Outputs.virtual_path());
    // The name is checked as the tool checks it (inside outputs, no `..`), then opened once,
    // beneath the outputs folder with links refused, and what was opened is what is sent.
    let opened =
        tokio::task::spawn_blocking(move || -> Option<(std::fs::File, u64, String, String)> {
            let resolved = folders.resolve(&virtual_path, PathAccess::Read).ok()?;
            if resolved.area != Area::Outputs {
                return None;
            }
            let name = resolved.name();
            let opened = open_presented(&folders, &name, max_bytes).ok()?;
            let media_type = media_type(&name).to_owned();
            Some((opened.file, opened.size, name, media_type))
        })
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let Some((opened, size, name, media_type)) = opened else {
        return Err(no_file(name));
    };
    // Streamed, never held whole; exactly the size announced, even if the file grows meanwhile.
    let reader = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(opened), size);
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    let file_name = name.rsplit('/').next().unwrap_or(&name);
    let disposition = format!(
        "attachment; filename=\"{}\"; filename*=UTF-8''{}",
        ascii_file_name(file_name),
        encode_path(file_name).replace('/', "%2F")
    );
    metrics::counter!("antler_file_downloads_total").increment(1);
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, media_type),
            (axum::http::header::CONTENT_DISPOSITION, disposition),
            (
                axum::http::header::X_CONTENT_TYPE_OPTIONS,
                "nosniff".to_owned(),
            ),
            (axum::http::header::CONTENT_LENGTH, size.to_string()),
        ],
        body,
    )
        .into_response())
}

/// `GET /api/v1/threads/{id}/events`
pub(crate) async fn thread_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Arc<Principal>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    readable_thread(&state, &principal, &id).await?;
    let permit = stream_permit(&state)?;
    let stream = thread_stream(state.hub.subscribe(&id), state.stop.clone(), permit);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
