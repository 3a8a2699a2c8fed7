//! Where charts may be fetched from, and the guard that holds helm to it.
//!
//! A chart source is a URL a tenant writes. Fetched from the operator's pod, an
//! `http://169.254.169.254/` repository reads the cloud's metadata service, and an in-cluster
//! address reaches services no tenant may reach; helm's error text would then tell the tenant what
//! answered. So in multi-tenant mode (or with `--chart-source-allow`) every connection helm makes
//! to fetch a chart goes through [`Guard`], a forward proxy on loopback that lives for one fetch:
//! it resolves each host itself, judges every address by the [`SourcePolicy`], and connects
//! only to addresses it judged, so a redirect, an index that points elsewhere or a DNS answer
//! that changes in between cannot lead helm anywhere else. Helm (Go's `net/http`) honours
//! `HTTPS_PROXY` / `HTTP_PROXY` for every host but `localhost` and loopback addresses written as
//! such, which [`SourcePolicy::check_url`] refuses before helm starts.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Address ranges that are not public: loopback, link-local (cloud metadata services),
/// private and shared ranges (where clusters put their pods and services), and every other
/// special-purpose range of the IANA registries.
const NOT_PUBLIC: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// One entry of `--chart-source-allow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// A host name, exactly (case-insensitive).
    Host(String),
    /// `*.example.com`: every host under it (not `example.com` itself).
    Suffix(String),
    /// Addresses in this range.
    Range(IpNet),
}

impl std::str::FromStr for Allowed {
    type Err = String;

    fn from_str(text: &str) -> Result<Allowed, String> {
        let text = text.trim();
        if let Ok(range) = text.parse::<IpNet>() {
            return Ok(Allowed::Range(range));
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Allowed::Range(IpNet::from(ip)));
        }
        let host = text.to_ascii_lowercase();
        let (suffix, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, host),
        };
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(format!(
                "{text:?} is neither a host name (charts.example.com, *.example.com) nor an \
                 address range (10.20.0.0/16)"
            ));
        }
        Ok(if suffix {
            Allowed::Suffix(name)
        } else {
            Allowed::Host(name)
        })
    }
}

/// Where charts may be fetched from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePolicy {
    /// `--chart-source-allow`: when not empty, only these hosts and ranges.
    pub allow: Vec<Allowed>,
    /// `--chart-source-deny`: never these ranges.
    pub deny: Vec<IpNet>,
    /// Multi-tenant mode: addresses that are not public are refused unless allowed, and what a
    /// failing source answered is never told (only its host and HTTP status).
    pub multi_tenant: bool,
}

/// A source the policy refuses: which host or address, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub host: String,
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not an allowed chart source: {}",
            self.host, self.why
        )
    }
}

impl SourcePolicy {
    /// Whether fetches go through the guard at all: a single-tenant controller without an
    /// allow-list fetches as helm does.
    pub fn guarded(&self) -> bool {
        self.multi_tenant || !self.allow.is_empty() || !self.deny.is_empty()
    }

    /// `host` (a name or an address) as the allow-list names it.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allow.iter().any(|allowed| match allowed {
            Allowed::Host(name) => *name == host,
            Allowed::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.ends_with('.')),
            Allowed::Range(_) => false,
        })
    }

    /// Why `ip` may not be connected to (for `host`), None when it may.
    fn judge_ip(&self, host: &str, ip: IpAddr) -> Option<String> {
        // An IPv4 address written as IPv6 is judged as what it is.
        let ip = match ip {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        if let Some(range) = self.deny.iter().find(|range| range.contains(&ip)) {
            return Some(format!("{ip} is in {range} (--chart-source-deny)"));
        }
        if self.host_allowed(host) {
            return None;
        }
        let in_allowed_range = self
            .allow
            .iter()
            .any(|allowed| matches!(allowed, Allowed::Range(range) if range.contains(&ip)));
        if in_allowed_range {
            return None;
        }
        if !self.allow.is_empty() {
            return Some(format!(
                "neither the host nor {ip} is in --chart-source-allow"
            ));
        }
        if self.multi_tenant
            && let Some(range) = NOT_PUBLIC
                .iter()
                .filter_map(|r| r.parse::<IpNet>().ok())
                .find(|range| range.contains(&ip))
        {
            return Some(format!(
                "{ip} is not a public address ({range}); this controller runs multi-tenant and \
                 fetches from such addresses only when --chart-source-allow lists them"
            ));
        }
        None
    }

    /// The addresses of `host:port` that may be connected to, all of them judged: Err when
    /// any is refused (a name that resolves to one refused address is refused) or the name
    /// does not resolve.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refused> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match tokio::net::lookup_host((bare, port)).await {
                Ok(found) => found.collect(),
                Err(e) => {
                    return Err(Refused {
                        host: host.to_string(),
                        why: format!("the name does not resolve ({e})"),
                    });
                }
            },
        };
        if addresses.is_empty() {
            return Err(Refused {
                host: host.to_string(),
                why: "the name resolves to no address".to_string(),
            });
        }
        for address in &addresses {
            if let Some(why) = self.judge_ip(bare, address.ip()) {
                return Err(Refused {
                    host: host.to_string(),
                    why,
                });
            }
        }
        Ok(addresses)
    }

    /// Checks the URL a release names (`https://host/...`, `oci://host/...`) before helm is
    /// started: its host must be allowed, and loopback written as such (which helm reaches
    /// without a proxy) is refused outright when guarded.
    pub async fn check_url(&self, url: &str) -> Result<(), Refused> {
        if !self.guarded() {
            return Ok(());
        }
        let (host, port) = host_port(url).ok_or_else(|| Refused {
            host: url.to_string(),
            why: "the URL names no host".to_string(),
        })?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = bare.eq_ignore_ascii_case("localhost")
            || bare
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
        if loopback && !self.host_allowed(bare) && self.judge_ip(bare, loopback_ip()).is_some() {
            return Err(Refused {
                host,
                why: "a loopback address is the operator's own pod".to_string(),
            });
        }
        self.resolve(&host, port).await.map(|_| ())
    }
}

fn loopback_ip() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

/// The host and port of a URL (`scheme://[user@]host[:port]/...`), the port defaulting by
/// scheme (443 but for `http`).
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let default = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None => default,
        };
        (format!("[{host}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (authority.to_string(), default),
        }
    };
    (!host.is_empty()).then_some((host, port))
}

/// The most a proxied request's head may be.
const MAX_HEAD: usize = 16 * 1024;

/// A forward proxy on loopback for the fetches of one chart, holding every connection to the
/// [`SourcePolicy`]; stopped when dropped. What it refused is kept for the error.
pub struct Guard {
    address: SocketAddr,
    refused: Arc<Mutex<Vec<Refused>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    pub async fn start(policy: SourcePolicy) -> std::io::Result<Guard> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let refused = Arc::new(Mutex::new(Vec::new()));
        let policy = Arc::new(policy);
        let kept = Arc::clone(&refused);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (policy, kept) = (Arc::clone(&policy), Arc::clone(&kept));
                tokio::spawn(async move {
                    if let Err(refusal) = proxy(client, &policy).await {
                        kept.lock().unwrap_or_else(|e| e.into_inner()).push(refusal);
                    }
                });
            }
        });
        Ok(Guard {
            address,
            refused,
            task,
        })
    }

    /// The environment that sends helm's connections through the guard (no host is exempt).
    pub fn environment(&self) -> Vec<(String, String)> {
        let url = format!("http://{}", self.address);
        let mut env = Vec::new();
        for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
            env.push((name.to_string(), url.clone()));
        }
        for name in ["NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"] {
            env.push((name.to_string(), String::new()));
        }
        env
    }

    /// The connections refused so far.
    pub fn refused(&self) -> Vec<Refused> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Answers a refused proxy request.
async fn refuse(client: &mut TcpStream) {
    let answer = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let _ = client.write_all(answer).await;
}

/// A connection to `host:port` at an address the policy allows: Err (after answering 403) when it
/// refuses them, None (after answering 502) when none answers.
async fn upstream(
    client: &mut TcpStream,
    policy: &SourcePolicy,
    host: &str,
    port: u16,
) -> Result<Option<TcpStream>, Refused> {
    let addresses = match policy.resolve(host, port).await {
        Ok(addresses) => addresses,
        Err(refusal) => {
            refuse(client).await;
            return Err(refusal);
        }
    };
    match TcpStream::connect(&addresses[..]).await {
        Ok(upstream) => Ok(Some(upstream)),
        Err(_) => {
            let answer =
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            let _ = client.write_all(answer).await;
            Ok(None)
        }
    }
}

/// Serves one client connection: a `CONNECT host:port` tunnel (HTTPS), or one plain-HTTP
/// request in absolute form, forwarded with `Connection: close` so that the client never sends
/// a request for another host over it. Err when the policy refused the target.
async fn proxy(mut client: TcpStream, policy: &SourcePolicy) -> Result<(), Refused> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let end = loop {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if head.len() > MAX_HEAD {
            let _ = client
                .write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n",
                )
                .await;
            return Ok(());
        }
    };
    let (head, body) = head.split_at(end);
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = host_port(&format!("https://{target}")) else {
            refuse(&mut client).await;
            return Ok(());
        };
        let Some(mut upstream) = upstream(&mut client, policy, &host, port).await? else {
            return Ok(());
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return Ok(());
        }
        if !body.is_empty() && upstream.write_all(body).await.is_err() {
            return Ok(());
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return Ok(());
    }
    // A plain-HTTP request: only the absolute form is proxied.
    let Some((host, port)) = target
        .starts_with("http://")
        .then(|| host_port(target))
        .flatten()
    else {
        refuse(&mut client).await;
        return Ok(());
    };
    let Some(mut upstream) = upstream(&mut client, policy, &host, port).await? else {
        return Ok(());
    };
    let path = {
        let rest = &target["http://".len()..];
        match rest.find('/') {
            Some(i) => &rest[i..],
            None => "/",
        }
    };
    let mut forwarded = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        let hop = [
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
        if !hop {
            forwarded.push_str(line);
            forwarded.push_str("\r\n");
        }
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(forwarded.as_bytes()).await.is_err()
        || (!body.is_empty() && upstream.write_all(body).await.is_err())
    {
        return Ok(());
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], multi_tenant: bool) -> SourcePolicy {
        SourcePolicy {
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            deny: Vec::new(),
            multi_tenant,
        }
    }

    #[test]
    fn internal_addresses_are_refused_in_multi_tenant_mode_only() {
        let open = policy(&[], false);
        let locked = policy(&[], true);
        for ip in [
            "169.254.169.254",
            "10.96.0.1",
            "192.168.1.1",
            "172.20.0.5",
            "100.64.0.1",
            "127.0.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:169.254.169.254",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(locked.judge_ip("x", ip).is_some(), "{ip} allowed");
            assert!(open.judge_ip("x", ip).is_none(), "{ip} refused");
        }
        for ip in ["8.8.8.8", "140.82.112.3", "2606:4700::1111"] {
            assert!(locked.judge_ip("x", ip.parse().unwrap()).is_none(), "{ip}");
        }
    }

    #[test]
    fn the_allow_list_names_hosts_suffixes_and_ranges_and_nothing_else_passes() {
        let p = policy(
            &["charts.example.com", "*.corp.example", "10.20.0.0/16"],
            true,
        );
        assert!(
            p.judge_ip("charts.example.com", "10.1.1.1".parse().unwrap())
                .is_none()
        );
        assert!(
            p.judge_ip("a.b.corp.example", "10.1.1.1".parse().unwrap())
                .is_none()
        );
        assert!(
            p.judge_ip("corp.example", "10.1.1.1".parse().unwrap())
                .is_some()
        );
        assert!(p.judge_ip("other", "10.20.3.4".parse().unwrap()).is_none());
        assert!(p.judge_ip("other", "8.8.8.8".parse().unwrap()).is_some());
        let denied = SourcePolicy {
            deny: vec!["34.0.0.0/8".parse().unwrap()],
            ..policy(&["charts.example.com"], false)
        };
        assert!(
            denied
                .judge_ip("charts.example.com", "34.1.1.1".parse().unwrap())
                .is_some()
        );
        assert!("not a host!".parse::<Allowed>().is_err());
        assert!("".parse::<Allowed>().is_err());
    }

    #[test]
    fn urls_give_their_host_and_port() {
        let cases = [
            (
                "https://charts.example.com/a",
                Some(("charts.example.com", 443)),
            ),
            ("http://user:pw@10.0.0.1:8080/x", Some(("10.0.0.1", 8080))),
            ("oci://registry:5000/charts/app", Some(("registry", 5000))),
            ("http://[::1]:81/", Some(("[::1]", 81))),
            ("http://[fe80::1]/", Some(("[fe80::1]", 80))),
            ("no-scheme", None),
            ("http://:80/", None),
        ];
        for (url, want) in cases {
            let got = host_port(url);
            assert_eq!(got.as_ref().map(|(h, p)| (h.as_str(), *p)), want, "{url}");
        }
    }
}

#[cfg(test)]
mod guard_tests {
    use super::*;

    /// What the guard answers `request`, read to its end (a tunnel that stays open, to its
    /// head).
    async fn ask(guard: &Guard, request: &str) -> String {
        let mut stream = TcpStream::connect(guard.address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        let read = async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
                if answer.starts_with(b"HTTP/1.1 200 Connection established\r\n\r\n") {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn the_guard_forwards_what_the_policy_allows_and_refuses_the_rest() {
        // An origin on loopback that tells what it was asked.
        let origin = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = origin.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = origin.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let asked = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let body = asked.lines().next().unwrap_or_default().to_string();
                    let close = asked.contains("Connection: close");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}{}",
                        body.len() + 6,
                        if close { " close" } else { " keep!" }
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        let guard = Guard::start(SourcePolicy {
            allow: vec!["127.0.0.1/32".parse().unwrap()],
            deny: Vec::new(),
            multi_tenant: true,
        })
        .await
        .unwrap();
        let answer = ask(
            &guard,
            &format!(
                "GET http://127.0.0.1:{port}/index.yaml HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Connection: keep-alive\r\n\r\n"
            ),
        )
        .await;
        // Forwarded in origin form, with the connection closed after it.
        assert!(
            answer.ends_with("GET /index.yaml HTTP/1.1 close"),
            "{answer}"
        );
        let answer = ask(
            &guard,
            &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 Connection established"),
            "{answer}"
        );
        for refused in [
            "CONNECT 169.254.169.254:443 HTTP/1.1\r\n\r\n",
            "GET http://10.0.0.1/x HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
            "GET /not-a-proxy-request HTTP/1.1\r\n\r\n",
        ] {
            let answer = ask(&guard, refused).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{refused}: {answer}");
        }
        let hosts: Vec<String> = guard.refused().into_iter().map(|r| r.host).collect();
        assert_eq!(hosts.len(), 2, "{hosts:?}");
        assert!(hosts.iter().any(|h| h == "169.254.169.254"), "{hosts:?}");
        assert!(hosts.iter().any(|h| h == "10.0.0.1"), "{hosts:?}");
    }

    #[tokio::test]
    async fn loopback_urls_are_refused_before_helm_runs_unless_allowed() {
        let locked = SourcePolicy {
            multi_tenant: true,
            ..SourcePolicy::default()
        };
        for url in [
            "http://localhost:8080/charts",
            "http://127.0.0.1/charts",
            "oci://[::1]:5000/charts/app",
            "http://169.254.169.254/latest",
        ] {
            assert!(locked.check_url(url).await.is_err(), "{url}");
        }
        let allowed = SourcePolicy {
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..locked.clone()
        };
        assert!(allowed.check_url("http://127.0.0.1:8080/").await.is_ok());
        // Nothing is checked for a single-tenant controller without a list.
        assert!(
            SourcePolicy::default()
                .check_url("http://169.254.169.254/")
                .await
                .is_ok()
        );
    }
}
