//! The embedded cluster: the test API server of this crate on 127.0.0.1, with the stand-ins for
//! what a real cluster runs besides its API server, for the demo's namespaces and any other:
//! - kube-controller-manager's Job controller and the kubelet for Jobs and their Pods
//!   ([`TestApiServer::job_controller_running_scripts`]): a Pod runs for `pace`, then succeeds or
//!   fails as its `sh -c 'echo ...; exit N'` command says, its echoed lines being its log;
//! - the Deployment controller and the kubelet for Deployments
//!   ([`TestApiServer::deployment_controller`]): a Deployment is available `pace` after its
//!   generation changed (no ReplicaSets or Pods are made).
//!
//! Plain HTTP, no credentials; everything is kept in memory and goes with the process.

use std::time::Duration;

use super::Result;
use crate::apiserver::TestApiServer;

/// Starts the server, prints its URL, writes a kubeconfig for it to `kubeconfig`, and serves
/// until the process is killed or its parent exits.
pub async fn serve(kubeconfig: &str, pace: Duration) -> Result<u8> {
    let server = TestApiServer::start().await;
    let _jobs = server.job_controller_running_scripts(pace);
    let _deployments = server.deployment_controller(pace);
    let url = server.url();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sequenced-demo\n  cluster:\n    server: {url}\n\
         users:\n- name: sequenced-demo\n  user: {{}}\ncontexts:\n- name: sequenced-demo\n  context:\n    \
         cluster: sequenced-demo\n    user: sequenced-demo\n    namespace: default\n\
         current-context: sequenced-demo\n"
    );
    println!("{url}");
    // Written whole under another name first: whoever waits for the file reads it complete (and
    // the URL printed).
    let partial = format!("{kubeconfig}.partial");
    std::fs::write(&partial, text).map_err(|e| format!("cannot write {partial}: {e}"))?;
    std::fs::rename(&partial, kubeconfig).map_err(|e| format!("cannot write {kubeconfig}: {e}"))?;
    super::exit_with_parent();
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}
