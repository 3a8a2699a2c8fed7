//! Kubernetes Events (`events.k8s.io/v1`) on a SequencedRelease, with the series client-go keeps:
//! the same event again within [`SERIES_WINDOW`] raises the count of the first instead of adding
//! an object. The key holds the note, as client-go's does (kube-runtime's `Recorder` leaves it
//! out, so "layer a started" and "layer b started" became one event with count 2 and the note of
//! the first).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;

/// How long a repeated event joins the series of the first (client-go: 6 minutes).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// The longest note the API server takes (bytes).
const MAX_NOTE: usize = 1024;

/// What makes two events the same one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: String,
    note: String,
    namespace: Option<String>,
    uid: Option<String>,
}

/// An event already recorded: its name and count.
struct Recorded {
    name: String,
    count: i32,
    last: Instant,
}

/// Records events for one controller.
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recorded: Mutex<HashMap<Key, Recorded>>,
}

impl Events {
    pub fn new(client: Client, controller: String, instance: String) -> Events {
        Events {
            client,
            controller,
            instance,
            recorded: Mutex::new(HashMap::new()),
        }
    }

    /// Records `reason` with `note` on `regarding`: a new Event, or the next count of the same
    /// one recorded less than [`SERIES_WINDOW`] ago.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let note = cut(note);
        let key = Key {
            warning,
            reason: reason.to_string(),
            note: note.to_string(),
            namespace: regarding.namespace.clone(),
            uid: regarding.uid.clone(),
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        // The lock is not held across requests: one release's events are published by one
        // reconcile at a time, and other releases' events have other keys.
        let earlier = {
            let mut recorded = self.recorded.lock().await;
            recorded.retain(|_, r| r.last.elapsed() < SERIES_WINDOW);
            recorded.get(&key).map(|r| (r.name.clone(), r.count))
        };
        let now = Timestamp::now();
        if let Some((name, count)) = earlier {
            let count = count.saturating_add(1);
            let series = json!({"series": EventSeries {
                count,
                last_observed_time: MicroTime(now),
            }});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => {
                    self.recorded.lock().await.insert(
                        key,
                        Recorded {
                            name,
                            count,
                            last: Instant::now(),
                        },
                    );
                    return Ok(());
                }
                // Gone (events expire after an hour, or were deleted): record it anew.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".to_string()),
            reason: Some(reason.to_string()),
            note: Some(note.to_string()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.recorded.lock().await.insert(
            key,
            Recorded {
                name,
                count: 1,
                last: Instant::now(),
            },
        );
        Ok(())
    }
}

/// `note` within [`MAX_NOTE`] bytes, cut at a character boundary with an ellipsis.
fn cut(note: &str) -> std::borrow::Cow<'_, str> {
    if note.len() <= MAX_NOTE {
        return note.into();
    }
    let mut end = MAX_NOTE - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_what_the_api_server_takes() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(600);
        let cut = cut(&long);
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with('…'));
    }
}
