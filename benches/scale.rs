//! Scale: N releases of a chart of 20 ConfigMaps in 4 chained layers of 5, spread over 10
//! namespaces, all created at once, reconciled by one controller (default concurrency) against
//! the test API server. Prints the time until all are Ready, the controller's requests per
//! release by verb and resource, the controller's peak RSS and CPU time, and the share of
//! `helm template` in it.
//!
//! The test API server runs in a child process (this binary, `SEQUENCED_SCALE_SERVER=1`), and
//! so does the driver that creates the releases and polls them until they are Ready, so the
//! RSS and CPU measured are the controller's own (and the creation of 10 namespaces).
//!
//! `cargo bench --bench scale` runs N = 100 and N = 1000; `cargo bench --bench scale -- 200`
//! runs the given sizes.

use sequenced_testkit as support;

use std::collections::BTreeMap;

use futures::StreamExt;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::controller::Tenancy;
use serde_json::json;
use support::apiserver::TestApiServer;
use support::charts::{chart, release};
use support::operator::{Controller, install_crd};
use support::process::{children_cpu_time, cpu_time, status_kib};

const SERVER_ENV: &str = "SEQUENCED_SCALE_SERVER";
const REPLICA_ENV: &str = "SEQUENCED_SCALE_REPLICA";
const NAMESPACES: usize = 10;
const CONTROLLER: &str = "scale-controller";

/// The chart: layers l1..l4 of 5 ConfigMaps each, each layer after the one before.
fn chained_chart() -> tempfile::TempDir {
    let mut files = Vec::new();
    for layer in 1..=4 {
        let mut text = String::new();
        for i in 1..=5 {
            let after = if layer == 1 {
                String::new()
            } else {
                format!("\n    helm.sh/depends-on/layers: l{}", layer - 1)
            };
            text.push_str(&format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}-l{layer}-{i}\n  annotations:\n    helm.sh/layer: l{layer}{after}\ndata:\n  value: {{{{ .Values.value | quote }}}}\n"
            ));
        }
        files.push((format!("templates/l{layer}.yaml"), text));
    }
    files.push(("values.yaml".into(), "value: one\n".into()));
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    chart("chained", &files)
}

/// The child: a test API server with the CRD, its URL on stdout; on each line `report CLIENT`
/// on stdin, the counts of that client's requests by verb and resource as one JSON line; on
/// `clear`, forgets the requests so far; on `create N PATH`, creates the releases; on `wait N`,
/// answers once they are all Ready.
fn serve() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = TestApiServer::start().await;
        install_crd(&server.client()).await;
        println!("{}", server.url());
        let mut lines = BufReader::new(std::io::stdin()).lines();
        while let Some(Ok(line)) = tokio::task::block_in_place(|| lines.next()) {
            if let Some(client) = line.strip_prefix("report ") {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for r in server.requests() {
                    if r.client.as_deref() != Some(client) {
                        continue;
                    }
                    let mut resource = r.kind.clone().unwrap_or_else(|| r.path.clone());
                    if let Some(sub) = &r.subresource {
                        resource = format!("{resource}/{sub}");
                    }
                    let verb = if r.query.split('&').any(|p| p == "dryRun=All") {
                        format!("{} (dry run)", r.verb)
                    } else {
                        r.verb.to_string()
                    };
                    *counts.entry(format!("{verb} {resource}")).or_default() += 1;
                }
                println!("{}", serde_json::to_string(&counts).unwrap());
            } else if line == "clear" {
                server.clear_requests();
                println!("{{}}");
            } else if let Some(args) = line.strip_prefix("create ") {
                let mut args = args.split(' ');
                let n = args.next().expect("create N PATH [INTERVAL]");
                let path = args.next().expect("create N PATH [INTERVAL]");
                let extra = match args.next() {
                    Some(interval) => json!({"interval": interval}),
                    None => json!({}),
                };
                create(
                    &server.client(),
                    n.parse().unwrap(),
                    std::path::Path::new(path),
                    extra,
                )
                .await;
                println!("{{}}");
            } else if let Some(n) = line.strip_prefix("wait ") {
                wait_ready(&server, n.parse().unwrap(), 1).await;
                println!("{{}}");
            } else if let Some(n) = line.strip_prefix("upgraded ") {
                wait_ready(&server, n.parse().unwrap(), 2).await;
                println!("{{}}");
            } else if line == "upgrade" {
                upgrade(&server.client()).await;
                println!("{{}}");
            } else if let Some(n) = line.strip_prefix("spread ") {
                let n: usize = n.parse().unwrap();
                let holders = loop {
                    let holders =
                        support::operator::shard_holders(&server.client(), "default").await;
                    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                    for h in holders.values() {
                        *counts.entry(h.as_str()).or_default() += 1;
                    }
                    if holders.len() == 32
                        && counts.len() == n
                        && counts.values().all(|&c| c <= 32usize.div_ceil(n))
                    {
                        break holders;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                println!("{}", serde_json::to_string(&holders).unwrap());
            } else if line == "twice" {
                // Objects applied more than once (successfully) since the last `clear`.
                let mut applies: BTreeMap<String, usize> = BTreeMap::new();
                for r in server.requests() {
                    if r.verb == "apply" && r.status < 300 && !r.query.contains("dryRun=All") {
                        *applies.entry(r.path.clone()).or_default() += 1;
                    }
                }
                let twice = applies.values().filter(|&&n| n > 1).count();
                println!("{twice}");
            }
        }
    });
}

/// Creates `releases` releases of the chart at `path`, over [`NAMESPACES`] namespaces, all at
/// once (as the driver of the benchmark, in the server's process: its connections and reads are
/// not the controller's).
async fn create(
    client: &kube::Client,
    releases: usize,
    path: &std::path::Path,
    extra: serde_json::Value,
) {
    let creates = (0..releases).map(|i| {
        let api: Api<SequencedRelease> =
            Api::namespaced(client.clone(), &format!("scale-{}", i % NAMESPACES));
        let sr: SequencedRelease =
            serde_json::from_value(release(&format!("r{i}"), path, extra.clone())).unwrap();
        async move { api.create(&PostParams::default(), &sr).await.unwrap() }
    });
    // At most 64 at once: 10,000 connections at once are refused by the loopback listener.
    futures::stream::iter(creates)
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
}

/// Changes every release's values: a new revision of each.
async fn upgrade(client: &kube::Client) {
    let all: Api<SequencedRelease> = Api::all(client.clone());
    let listed = all.list(&ListParams::default()).await.unwrap();
    let patches = listed.items.iter().map(|sr| {
        let api: Api<SequencedRelease> =
            Api::namespaced(client.clone(), sr.metadata.namespace.as_deref().unwrap());
        let name = sr.metadata.name.clone().unwrap();
        async move {
            api.patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"values": {"value": "two"}}})),
            )
            .await
            .unwrap()
        }
    });
    futures::stream::iter(patches)
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
}

/// Returns once all `releases` releases are Ready at `revision` (or later), looking every 2 s
/// at the server's own store (a list through the API every 250 ms of 10,000 releases held up
/// the server for everyone).
async fn wait_ready(server: &TestApiServer, releases: usize, revision: i64) {
    let started = Instant::now();
    let mut last = (0, Instant::now());
    let mut told = Instant::now();
    loop {
        let all = server.objects("sequenced.dev/v1alpha1", "SequencedRelease", None);
        let is_ready = |sr: &serde_json::Value| {
            let ready = sr["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready && sr["status"]["revision"].as_i64().unwrap_or(0) >= revision
        };
        let ready = all.iter().filter(|sr| is_ready(sr)).count();
        if ready == releases {
            return;
        }
        if ready != last.0 {
            last = (ready, Instant::now());
        }
        // Progress on stderr, and the releases still waiting once nothing moved for a minute
        // (a stalled release shows there with its status message).
        if told.elapsed() >= Duration::from_secs(30) {
            told = Instant::now();
            eprintln!(
                "  {:.0} s: {ready} of {releases} Ready at revision {revision}",
                started.elapsed().as_secs_f64()
            );
            if last.1.elapsed() >= Duration::from_secs(60) {
                for sr in all.iter().filter(|sr| !is_ready(sr)).take(10) {
                    eprintln!(
                        "    waiting: {}/{} phase {} revision {}: {}",
                        sr["metadata"]["namespace"].as_str().unwrap_or(""),
                        sr["metadata"]["name"].as_str().unwrap_or(""),
                        sr["status"]["phase"],
                        sr["status"]["revision"],
                        sr["status"]["message"].as_str().unwrap_or("")
                    );
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "only {ready} of {releases} Ready after an hour"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// This binary again, in the child mode `env` selects, talking over its stdin and stdout.
fn spawn_self(env: &[(&str, &str)]) -> (Child, ChildStdin, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a child process");
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

struct ServerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    url: String,
}

impl ServerProcess {
    fn start() -> ServerProcess {
        let (child, stdin, mut stdout) = spawn_self(&[(SERVER_ENV, "1")]);
        let mut url = String::new();
        stdout.read_line(&mut url).unwrap();
        ServerProcess {
            child,
            stdin,
            stdout,
            url: url.trim().to_string(),
        }
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        answer
    }

    fn config(&self, client: &str) -> kube::Config {
        let mut config = kube::Config::new(self.url.parse().unwrap());
        config.default_namespace = "default".into();
        config.headers.push((
            http::HeaderName::from_static("x-test-client"),
            http::HeaderValue::from_str(client).unwrap(),
        ));
        config
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Run {
    releases: usize,
    ready_after: Duration,
    peak_rss_mib: f64,
    /// When all are Ready.
    rss_mib: f64,
    controller_cpu: Duration,
    helm_cpu: Duration,
    counts: BTreeMap<String, usize>,
}

fn run(releases: usize) -> Run {
    let mut server = ServerProcess::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let chart_dir = chained_chart();
    let path = chart_dir.path().join("chained");
    let driver_config = server.config("scale-driver");
    let (ready_after, controller) = runtime.block_on(async {
        let driver = kube::Client::try_from(driver_config).unwrap();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(driver.clone());
        for n in 0..NAMESPACES {
            let ns = serde_json::from_value(json!({"metadata": {"name": format!("scale-{n}")}}))
                .unwrap();
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
        }
        let controller = Controller::start_as(
            server.config(CONTROLLER),
            CONTROLLER,
            sequenced::cli::DEFAULT_CONCURRENCY,
            Tenancy::default(),
        );
        // The releases are created and waited on by the server's process.
        let started = Instant::now();
        tokio::task::block_in_place(|| {
            server.ask(&format!("create {releases} {}", path.display()));
            server.ask(&format!("wait {releases}"));
        });
        (started.elapsed(), controller)
    });
    let controller_cpu = cpu_time();
    let helm_cpu = children_cpu_time();
    let peak_rss_mib = status_kib("VmHWM:") as f64 / 1024.0;
    let rss_mib = status_kib("VmRSS:") as f64 / 1024.0;
    let counts: BTreeMap<String, usize> =
        serde_json::from_str(&server.ask(&format!("report {CONTROLLER}"))).unwrap();
    runtime.block_on(controller.stop());
    Run {
        releases,
        ready_after,
        peak_rss_mib,
        rss_mib,
        controller_cpu,
        helm_cpu,
        counts,
    }
}

/// A replica child: a controller named `name` against the server at `url`, with the operator's
/// default shards (32 shards, 15 s Leases); on `report` on stdin, its peak RSS, RSS and CPU
/// time (its own and its helm processes') as one JSON line; stops at the end of stdin.
fn replica(name: &str, url: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.default_namespace = "default".into();
        config.headers.push((
            http::HeaderName::from_static("x-test-client"),
            http::HeaderValue::from_str(name).unwrap(),
        ));
        let _controller = Controller::start_sharded(
            config,
            name,
            sequenced::cli::DEFAULT_CONCURRENCY,
            Tenancy::default(),
            sequenced::lock::Sharding::default(),
        );
        let mut lines = BufReader::new(std::io::stdin()).lines();
        while let Some(Ok(line)) = tokio::task::block_in_place(|| lines.next()) {
            if line == "report" {
                println!(
                    "{}",
                    json!({
                        "peak_rss_mib": status_kib("VmHWM:") as f64 / 1024.0,
                        "rss_mib": status_kib("VmRSS:") as f64 / 1024.0,
                        "cpu_s": cpu_time().as_secs_f64(),
                        "helm_cpu_s": children_cpu_time().as_secs_f64(),
                    })
                );
            }
        }
    });
}

/// A replica process and its stdin/stdout.
struct ReplicaProcess {
    name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ReplicaProcess {
    fn start(name: &str, url: &str) -> ReplicaProcess {
        let (child, stdin, stdout) =
            spawn_self(&[(REPLICA_ENV, name), ("SEQUENCED_SCALE_URL", url)]);
        ReplicaProcess {
            name: name.to_string(),
            child,
            stdin,
            stdout,
        }
    }

    fn report(&mut self) -> serde_json::Value {
        writeln!(self.stdin, "report").unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap()
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The requests of `clients` since the last `clear`, by verb and resource, summed.
fn requests_of(server: &mut ServerProcess, clients: &[String]) -> BTreeMap<String, usize> {
    let mut total: BTreeMap<String, usize> = BTreeMap::new();
    for client in clients {
        let counts: BTreeMap<String, usize> =
            serde_json::from_str(&server.ask(&format!("report {client}"))).unwrap();
        for (what, n) in counts {
            *total.entry(what).or_default() += n;
        }
    }
    total
}

/// `releases` releases over `replicas` replica processes (default shards and Leases): the
/// time to all Ready, each replica's peak RSS and CPU, requests per release; the requests of one
/// idle `interval` (60 s here) per release; then an upgrade of every release with the first
/// replica killed (SIGKILL) 3 s into it: the time until every release is Ready at revision 2,
/// and how many objects were applied more than once.
fn run_replicas(releases: usize, replicas: usize) {
    let mut server = ServerProcess::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let chart_dir = chained_chart();
    let path = chart_dir.path().join("chained");
    let driver_config = server.config("scale-driver");
    runtime.block_on(async {
        let driver = kube::Client::try_from(driver_config).unwrap();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(driver.clone());
        for n in 0..NAMESPACES {
            let ns = serde_json::from_value(json!({"metadata": {"name": format!("scale-{n}")}}))
                .unwrap();
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
        }
    });
    let names: Vec<String> = (0..replicas).map(|i| format!("replica-{i}")).collect();
    let mut processes: Vec<ReplicaProcess> = names
        .iter()
        .map(|n| ReplicaProcess::start(n, &server.url))
        .collect();
    let spread_started = Instant::now();
    let holders: BTreeMap<u32, String> =
        serde_json::from_str(&server.ask(&format!("spread {replicas}"))).unwrap();
    let spread_after = spread_started.elapsed();
    server.ask("clear");
    let started = Instant::now();
    server.ask(&format!("create {releases} {} 60s", path.display()));
    server.ask(&format!("wait {releases}"));
    let ready_after = started.elapsed();
    let install = requests_of(&mut server, &names);
    let reports: Vec<serde_json::Value> = processes.iter_mut().map(|p| p.report()).collect();
    // One idle interval: every release is Ready; 60 s of what the replicas send.
    server.ask("clear");
    std::thread::sleep(Duration::from_secs(60));
    let idle = requests_of(&mut server, &names);
    if std::env::args().any(|a| a == "--no-kill") {
        report_replicas(
            &names,
            &reports,
            &holders,
            &install,
            &idle,
            releases,
            replicas,
            spread_after,
            ready_after,
            None,
        );
        return;
    }
    // An upgrade of every release, and the first replica killed in the middle of it.
    server.ask("clear");
    server.ask("upgrade");
    std::thread::sleep(Duration::from_secs(3));
    let killed = processes.remove(0);
    let killed_name = killed.name.clone();
    drop(killed);
    let killed_at = Instant::now();
    server.ask(&format!("upgraded {releases}"));
    let recovered_after = killed_at.elapsed();
    let twice: usize = server.ask("twice").trim().parse().unwrap();

    report_replicas(
        &names,
        &reports,
        &holders,
        &install,
        &idle,
        releases,
        replicas,
        spread_after,
        ready_after,
        Some((killed_name, recovered_after, twice)),
    );
}

/// Prints what [`run_replicas`] measured.
#[allow(clippy::too_many_arguments)]
fn report_replicas(
    names: &[String],
    reports: &[serde_json::Value],
    holders: &BTreeMap<u32, String>,
    install: &BTreeMap<String, usize>,
    idle: &BTreeMap<String, usize>,
    releases: usize,
    replicas: usize,
    spread_after: Duration,
    ready_after: Duration,
    killed: Option<(String, Duration, usize)>,
) {
    let per = |n: usize| n as f64 / releases as f64;
    let install_total: usize = install.values().sum();
    let idle_total: usize = idle.values().sum();
    let shards_of = |name: &str| holders.values().filter(|h| *h == name).count();
    println!(
        "{releases} releases over {replicas} replica(s): shards spread in {:.1} s; all Ready after {:.1} s; {:.1} requests per release ({:.2} per release per idle 60 s interval)",
        spread_after.as_secs_f64(),
        ready_after.as_secs_f64(),
        per(install_total),
        per(idle_total),
    );
    for (name, report) in names.iter().zip(reports) {
        println!(
            "  {name}: {} shards, peak RSS {:.0} MiB, CPU {:.1} s (helm {:.1} s)",
            shards_of(name),
            report["peak_rss_mib"].as_f64().unwrap_or(0.0),
            report["cpu_s"].as_f64().unwrap_or(0.0),
            report["helm_cpu_s"].as_f64().unwrap_or(0.0),
        );
    }
    if let Some((killed_name, recovered_after, twice)) = killed {
        println!(
            "  {killed_name} killed 3 s into an upgrade of every release: all Ready at revision 2 {:.1} s later; {twice} objects applied more than once",
            recovered_after.as_secs_f64()
        );
    }
    for (what, count) in install {
        println!("  install {what}: {:.2} per release", per(*count));
    }
    for (what, count) in idle {
        println!("  idle {what}: {:.3} per release", per(*count));
    }
}

fn main() {
    if std::env::var_os(SERVER_ENV).is_some() {
        serve();
        return;
    }
    if let Some(name) = std::env::var_os(REPLICA_ENV) {
        let url = std::env::var("SEQUENCED_SCALE_URL").expect("SEQUENCED_SCALE_URL");
        replica(&name.to_string_lossy(), &url);
        return;
    }
    if let Some(at) = std::env::args().position(|a| a == "--replicas") {
        let args: Vec<String> = std::env::args().collect();
        let replicas: usize = args
            .get(at + 1)
            .and_then(|r| r.parse().ok())
            .expect("--replicas R");
        let releases: usize = args
            .iter()
            .skip(1)
            .enumerate()
            .filter(|(i, _)| *i + 1 != at && *i + 1 != at + 1)
            .find_map(|(_, a)| a.parse().ok())
            .unwrap_or(100);
        run_replicas(releases, replicas);
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes = match (sizes.is_empty(), bench) {
        (false, _) => sizes,
        (true, true) => vec![100, 1000],
        (true, false) => vec![10],
    };
    if sizes.len() > 1 {
        // Each size in a process of its own, so that peak RSS and CPU are that size's.
        for n in sizes {
            let status = Command::new(std::env::current_exe().unwrap())
                .arg(n.to_string())
                .status()
                .expect("run one size");
            assert!(status.success());
        }
        return;
    }
    let run = run(sizes[0]);
    let total: usize = run.counts.values().sum();
    println!(
        "{} releases: all Ready after {:.1} s; controller peak RSS {:.0} MiB ({:.0} MiB once all are Ready), CPU {:.1} s (helm template {:.1} s more, {:.0}% of the controller's wall time on 2 cores); {:.1} requests per release",
        run.releases,
        run.ready_after.as_secs_f64(),
        run.peak_rss_mib,
        run.rss_mib,
        run.controller_cpu.as_secs_f64(),
        run.helm_cpu.as_secs_f64(),
        100.0 * run.helm_cpu.as_secs_f64() / (2.0 * run.ready_after.as_secs_f64()),
        total as f64 / run.releases as f64
    );
    for (what, count) in &run.counts {
        println!(
            "  {what}: {:.2} per release",
            *count as f64 / run.releases as f64
        );
    }
}
