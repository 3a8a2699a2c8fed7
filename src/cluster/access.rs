//! Who a release acts as, and what that account may do: SelfSubjectAccessReviews asked while
//! impersonating it, cached briefly, so that a layer the account may not write is refused
//! before any of its objects is.

use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::{Cluster, ClusterError, Kind};

/// How long an answer that allows is trusted; a right removed in the meantime shows up as the
/// API server's own 403, which names the same things.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long a refusal is trusted: a right granted after it is seen within this.
const REFUSED_FOR: Duration = Duration::from_secs(5);

/// A ServiceAccount a release acts as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account {
    pub namespace: String,
    pub name: String,
}

impl Account {
    /// The user name the API server gives the account's tokens:
    /// `system:serviceaccount:NAMESPACE:NAME`.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// `serviceaccount NAMESPACE:NAME`, as people read it in a status.
impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "serviceaccount {}:{}", self.namespace, self.name)
    }
}

/// A verb the controller uses on a release's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Patch,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Patch => "patch",
        }
    }
}

/// One question to the authorizer: a verb on a resource (group, plural) in a namespace (None:
/// cluster-scoped, or every namespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Question {
    verb: Verb,
    group: String,
    resource: String,
    namespace: Option<String>,
}

/// The plural resource name as the API server prints it: `configmaps`,
/// `clusterroles.rbac.authorization.k8s.io`.
pub(super) fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// The verb of a 403 as kube-apiserver's RBAC authorizer words it (`User "x" cannot create
/// resource "clusterroles" ...`); None when the 403 is not an authorization refusal (a
/// terminating namespace, an admission webhook).
pub(super) fn refused_verb(message: &str) -> Option<String> {
    let rest = message.split(" cannot ").nth(1)?;
    let (verb, rest) = rest.split_once(' ')?;
    rest.starts_with("resource ").then(|| verb.to_string())
}

/// The user of an RBAC refusal (`User "system:serviceaccount:ns:name" cannot ...`).
pub(super) fn refused_user(message: &str) -> Option<&str> {
    let rest = message.split("User \"").nth(1)?;
    let (user, rest) = rest.split_once('"')?;
    rest.starts_with(" cannot ").then_some(user)
}

impl Cluster {
    /// Whether the account this cluster acts as may `verb` objects of `kind` in `namespace`
    /// (asked with a SelfSubjectAccessReview as that account, the answer cached); Ok when it
    /// may, [`ClusterError::Forbidden`] naming `name` when it may not. The controller's own
    /// identity is not asked: what it may not do, the API server says.
    pub async fn may(
        &self,
        verb: Verb,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), ClusterError> {
        let Some(account) = &self.account else {
            return Ok(());
        };
        let question = Question {
            verb,
            group: kind.resource.group.clone(),
            resource: kind.resource.plural.clone(),
            namespace: namespace.filter(|_| kind.namespaced).map(str::to_string),
        };
        let cached = self.access.lock().ok().and_then(|answers| {
            let (allowed, at) = answers.get(&question)?;
            let fresh = at.elapsed() < if *allowed { ALLOWED_FOR } else { REFUSED_FOR };
            fresh.then_some(*allowed)
        });
        let allowed = match cached {
            Some(allowed) => allowed,
            None => {
                let allowed = self.ask(&question).await?;
                // A refusal of a server that is starting (RBAC's caches still loading) is
                // neither believed nor kept.
                let starting = !allowed && self.health.starting();
                if !starting && let Ok(mut answers) = self.access.lock() {
                    answers.insert(question.clone(), (allowed, Instant::now()));
                }
                allowed
            }
        };
        if allowed {
            return Ok(());
        }
        // Lists and watches are of a namespace (or the cluster), not of one object.
        let object = match (verb, &question.namespace) {
            (Verb::List | Verb::Watch, Some(ns)) => format!("in namespace {ns}"),
            (Verb::List | Verb::Watch, None) => "at the cluster scope".to_string(),
            _ => format!("\"{name}\""),
        };
        let action = format!(
            "{} {} {object}",
            verb.as_str(),
            qualified(&question.group, &question.resource)
        );
        if self.health.starting() {
            return Err(ClusterError::Starting {
                action: "asking whether it may".to_string(),
                object: action,
                message: format!("{account} was refused while the API server starts"),
                retry_after: None,
            });
        }
        Err(ClusterError::Forbidden {
            account: account.to_string(),
            action,
        })
    }

    async fn ask(&self, question: &Question) -> Result<bool, ClusterError> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: question.namespace.clone(),
                    verb: Some(question.verb.as_str().to_string()),
                    group: Some(question.group.clone()),
                    resource: Some(question.resource.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                let object = format!(
                    "{} {}",
                    question.verb.as_str(),
                    qualified(&question.group, &question.resource)
                );
                if let Some(starting) = self.starting_error("asking whether it may", &object, &e) {
                    return starting;
                }
                if let Some(refused) = self.impersonation_refused(&e) {
                    return refused;
                }
                self.api_error("asking whether it may", object, e)
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verb_of_an_rbac_refusal_is_read_from_the_message() {
        let message = "clusterroles.rbac.authorization.k8s.io is forbidden: User \"system:serviceaccount:t:deployer\" cannot create resource \"clusterroles\" in API group \"rbac.authorization.k8s.io\" at the cluster scope";
        assert_eq!(refused_verb(message).as_deref(), Some("create"));
        let terminating = "configmaps \"new\" is forbidden: unable to create new content in namespace x because it is being terminated";
        assert_eq!(refused_verb(terminating), None);
        assert_eq!(
            refused_user(message),
            Some("system:serviceaccount:t:deployer")
        );
        assert_eq!(refused_user(terminating), None);
    }

    #[test]
    fn an_account_reads_as_people_write_it() {
        let account = Account {
            namespace: "apps".into(),
            name: "deployer".into(),
        };
        assert_eq!(account.to_string(), "serviceaccount apps:deployer");
        assert_eq!(account.username(), "system:serviceaccount:apps:deployer");
    }
}
