//! Remote clusters (`spec.kubeConfig`): a kubeconfig, checked as Flux checks it by default, made
//! a client configuration.
//!
//! What the operator refuses in a kubeconfig, and why: an `exec` credential plugin (it would run
//! a program of the operator's image with the operator's rights, chosen by whoever may write the
//! Secret), an `auth-provider` (the same, through client-go's plugins), and every reference to a
//! file (`certificate-authority`, `client-certificate`, `client-key`, `tokenFile`): a tenant
//! would read the operator's own files with them. Credentials must be inline: a token, client
//! certificate and key data, a CA's data, or a username and password.

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A remote cluster's client configuration, and what names it in messages.
#[derive(Clone)]
pub struct RemoteConfig {
    pub config: kube::Config,
    /// The server's URL (`https://fleet-a.example.com:6443`).
    pub server: String,
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("RemoteConfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Reads a kubeconfig (its current context, else its only one), refuses what the operator
/// does not run or read (see the module), and makes its client configuration. Err says why the
/// kubeconfig cannot be used, for the status; it never quotes a credential.
pub async fn config_of(kubeconfig: &[u8]) -> Result<RemoteConfig, String> {
    let text = std::str::from_utf8(kubeconfig).map_err(|_| "it is not UTF-8 text".to_string())?;
    let parsed = Kubeconfig::from_yaml(text).map_err(|e| format!("it does not parse: {e}"))?;
    let context = context_of(&parsed)?;
    check(&parsed, &context)?;
    let server = parsed
        .clusters
        .iter()
        .find(|c| Some(&c.name) == context.cluster.as_ref())
        .and_then(|c| c.cluster.as_ref()?.server.clone())
        .unwrap_or_default();
    let options = KubeConfigOptions {
        context: Some(context.name.clone()),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &options)
        .await
        .map_err(|e| format!("it cannot be used: {e}"))?;
    // As the controller's own client: no blanket retry inside the client (a failed request
    // fails the reconcile, which says so and is retried with backoff).
    config.default_retry = false;
    Ok(RemoteConfig { config, server })
}

/// The context a kubeconfig names: its current one, else the only one there is.
#[derive(Debug)]
struct Chosen {
    name: String,
    cluster: Option<String>,
    user: Option<String>,
}

fn context_of(kubeconfig: &Kubeconfig) -> Result<Chosen, String> {
    let named = match &kubeconfig.current_context {
        Some(current) if !current.is_empty() => kubeconfig
            .contexts
            .iter()
            .find(|c| &c.name == current)
            .ok_or_else(|| format!("its current-context {current:?} is not one of its contexts"))?,
        _ => match kubeconfig.contexts.as_slice() {
            [only] => only,
            [] => return Err("it has no context".to_string()),
            _ => {
                return Err("it has several contexts and no current-context".to_string());
            }
        },
    };
    let context = named
        .context
        .as_ref()
        .ok_or_else(|| format!("its context {:?} is empty", named.name))?;
    Ok(Chosen {
        name: named.name.clone(),
        cluster: Some(context.cluster.clone()).filter(|c| !c.is_empty()),
        user: context.user.clone().filter(|u| !u.is_empty()),
    })
}

/// What the operator refuses in the cluster and user of the chosen context.
fn check(kubeconfig: &Kubeconfig, context: &Chosen) -> Result<(), String> {
    let cluster_name = context
        .cluster
        .as_ref()
        .ok_or_else(|| format!("its context {:?} names no cluster", context.name))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| &c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| format!("its cluster {cluster_name:?} is not defined, or empty"))?;
    if cluster.server.as_deref().is_none_or(str::is_empty) {
        return Err(format!("its cluster {cluster_name:?} has no server"));
    }
    if let Some(path) = &cluster.certificate_authority {
        return Err(file_refused(
            "cluster",
            cluster_name,
            "certificate-authority",
            path,
        ));
    }
    let Some(user_name) = &context.user else {
        return Ok(());
    };
    let Some(user) = kubeconfig
        .auth_infos
        .iter()
        .find(|u| &u.name == user_name)
        .and_then(|u| u.auth_info.as_ref())
    else {
        return Err(format!("its user {user_name:?} is not defined"));
    };
    if let Some(exec) = &user.exec {
        return Err(format!(
            "its user {user_name:?} runs an exec credential plugin ({}), which the operator refuses (as Flux does by default): put the credentials inline (a token, or client certificate and key data)",
            exec.command.as_deref().unwrap_or("no command")
        ));
    }
    if let Some(provider) = &user.auth_provider {
        return Err(format!(
            "its user {user_name:?} uses the auth provider {:?}, which the operator refuses (as Flux does by default): put the credentials inline (a token, or client certificate and key data)",
            provider.name
        ));
    }
    for (field, path) in [
        ("client-certificate", &user.client_certificate),
        ("client-key", &user.client_key),
        ("tokenFile", &user.token_file),
    ] {
        if let Some(path) = path {
            return Err(file_refused("user", user_name, field, path));
        }
    }
    Ok(())
}

fn file_refused(what: &str, name: &str, field: &str, path: &str) -> String {
    format!(
        "its {what} {name:?} names a file ({field}: {path}), which the operator does not read: put the data inline ({field}-data, or token)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str, cluster_extra: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet\n  cluster:\n    server: https://fleet.example.com:6443\n{cluster_extra}users:\n- name: deployer\n  user:\n{user}contexts:\n- name: fleet\n  context:\n    cluster: fleet\n    user: deployer\ncurrent-context: fleet\n"
        )
    }

    fn run(text: &str) -> Result<RemoteConfig, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(config_of(text.as_bytes()))
    }

    #[test]
    fn inline_credentials_are_used() {
        let config = run(&kubeconfig("    token: s3cr3t\n", "")).unwrap();
        assert_eq!(config.server, "https://fleet.example.com:6443");
        assert_eq!(
            config.config.cluster_url.to_string(),
            "https://fleet.example.com:6443/"
        );
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }

    #[test]
    fn exec_plugins_auth_providers_and_files_are_refused() {
        let cases = [
            (
                kubeconfig(
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\n",
                    "",
                ),
                "runs an exec credential plugin (aws)",
            ),
            (
                kubeconfig(
                    "    auth-provider:\n      name: gcp\n      config: {}\n",
                    "",
                ),
                "uses the auth provider \"gcp\"",
            ),
            (
                kubeconfig(
                    "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                    "",
                ),
                "names a file (tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token)",
            ),
            (
                kubeconfig(
                    "    client-certificate: /etc/cert.pem\n    client-key-data: eA==\n",
                    "",
                ),
                "names a file (client-certificate: /etc/cert.pem)",
            ),
            (
                kubeconfig("    token: t\n", "    certificate-authority: /etc/ca.pem\n"),
                "its cluster \"fleet\" names a file (certificate-authority: /etc/ca.pem)",
            ),
        ];
        for (text, expected) in cases {
            let err = run(&text).expect_err(expected);
            assert!(err.contains(expected), "{err}\nexpected: {expected}");
        }
    }

    #[test]
    fn a_kubeconfig_that_names_no_usable_cluster_says_why() {
        assert!(
            run("not: [yaml")
                .unwrap_err()
                .starts_with("it does not parse")
        );
        assert_eq!(
            run("apiVersion: v1\nkind: Config\n").unwrap_err(),
            "it has no context"
        );
        let missing = kubeconfig("    token: t\n", "")
            .replace("current-context: fleet", "current-context: other");
        assert_eq!(
            run(&missing).unwrap_err(),
            "its current-context \"other\" is not one of its contexts"
        );
        let no_server = kubeconfig("    token: t\n", "").replace(
            "    server: https://fleet.example.com:6443\n",
            "    insecure-skip-tls-verify: true\n",
        );
        assert_eq!(
            run(&no_server).unwrap_err(),
            "its cluster \"fleet\" has no server"
        );
    }
}
