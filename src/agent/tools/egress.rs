//! The shell's way out with `network = true`: an HTTP proxy that only reaches public addresses.
//!
//! A sandboxed command never gets a route of its own. Under bubblewrap it has a network
//! namespace with nothing but loopback, where the launcher relays `127.0.0.1:3128` to this
//! proxy's Unix socket (bound into the sandbox); under Landlock it may open TCP connections to
//! this proxy's port and to no other. `HTTP_PROXY`, `HTTPS_PROXY` (and their lower-case
//! spellings) point there, so curl, pip, git, npm and the like work unchanged.
//!
//! The proxy takes `CONNECT host:port` (HTTPS and any other TCP protocol) and absolute-form
//! HTTP requests (`GET http://host/...`). It resolves the host itself and connects only when
//! every address is public ([`is_public`], the same rule as `web_fetch`: no loopback, private,
//! link-local or cloud metadata address, nor an IPv6 form embedding one) and none is one of
//! antler's own listeners; it then connects to exactly the address it checked, so a changing
//! DNS answer cannot turn a check into a way in. Anything else is answered 403 with the reason.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use super::web_fetch::is_public;

/// The longest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Connections open at once, over every command.
const MAX_CONNECTIONS: usize = 64;
/// How long the head, a DNS answer and a connection may take each.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

/// The proxy, serving until dropped.
#[derive(Debug)]
pub(crate) struct Egress {
    unix: PathBuf,
    port: u16,
    _unix_task: AbortOnDropHandle<()>,
    _tcp_task: AbortOnDropHandle<()>,
}

impl Egress {
    /// Starts the proxy on the Unix socket `unix` (replacing a stale one) and on a free port of
    /// 127.0.0.1; `own` are antler's listeners, never reached through it.
    pub(crate) async fn start(unix: PathBuf, own: Vec<SocketAddr>) -> std::io::Result<Self> {
        Self::start_with(unix, own, is_public).await
    }

    /// [`Egress::start`] with `reachable` deciding which addresses may be reached.
    async fn start_with(
        unix: PathBuf,
        own: Vec<SocketAddr>,
        reachable: fn(IpAddr) -> bool,
    ) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt as _;
        match tokio::fs::remove_file(&unix).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let unix_listener = tokio::net::UnixListener::bind(&unix)?;
        // The sandbox's user (another one when antler is root) must be able to connect.
        tokio::fs::set_permissions(&unix, std::fs::Permissions::from_mode(0o666)).await?;
        let tcp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = tcp_listener.local_addr()?.port();
        let own = Arc::new(Policy {
            own: own.into(),
            reachable,
        });
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let unix_task = {
            let (own, permits) = (Arc::clone(&own), Arc::clone(&permits));
            tokio::spawn(async move {
                while let Ok((stream, _)) = unix_listener.accept().await {
                    spawn_connection(stream, &own, &permits);
                }
            })
        };
        let tcp_task = tokio::spawn(async move {
            while let Ok((stream, _)) = tcp_listener.accept().await {
                spawn_connection(stream, &own, &permits);
            }
        });
        Ok(Self {
            unix,
            port,
            _unix_task: AbortOnDropHandle::new(unix_task),
            _tcp_task: AbortOnDropHandle::new(tcp_task),
        })
    }

    /// The port on 127.0.0.1.
    #[cfg(test)]
    fn port(&self) -> u16 {
        self.port
    }

    /// The proxy as the sandbox is told of it.
    pub(crate) fn endpoints(&self) -> crate::sandbox::Egress {
        crate::sandbox::Egress {
            unix: self.unix.clone(),
            port: self.port,
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        // Best effort: a socket left behind is removed by the next start.
        let _ = std::fs::remove_file(&self.unix);
    }
}

fn spawn_connection<S>(stream: S, own: &Arc<Policy>, permits: &Arc<Semaphore>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(permit) = Arc::clone(permits).try_acquire_owned() else {
        // Full: the connection is dropped, which the client sees as a refusal.
        return;
    };
    let own = Arc::clone(own);
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(refusal) = serve(stream, &own).await {
            tracing::debug!(%refusal, "the shell's proxy refused a request");
        }
    });
}

/// Which addresses the proxy reaches.
#[derive(Debug)]
struct Policy {
    /// antler's listeners: never.
    own: Box<[SocketAddr]>,
    /// Whether an address may be reached ([`is_public`]).
    reachable: fn(IpAddr) -> bool,
}

/// What a request asked for.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// For absolute-form HTTP: the head to send instead (origin-form request line).
    forward_head: Option<Vec<u8>>,
}

/// Why a request was not proxied; the text goes back to the command.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("bad request: {0}")]
    Bad(String),
    #[error("{0} is not a public address (the shell may reach public hosts only)")]
    NotPublic(String),
    #[error("{0} is one of antler's own listeners")]
    Own(String),
    #[error("cannot reach {0}")]
    Unreachable(String),
    #[error("the client went away: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves one client connection.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    policy: &Policy,
) -> Result<(), Refusal> {
    let (head, rest) = match tokio::time::timeout(STEP_TIMEOUT, read_head(&mut client)).await {
        Ok(read) => read?,
        Err(_) => return Err(Refusal::Bad("the request head did not arrive".to_owned())),
    };
    let answer = async {
        let target = parse(&head)?;
        let address = resolve(&target.host, target.port, policy).await?;
        let upstream = tokio::time::timeout(STEP_TIMEOUT, tokio::net::TcpStream::connect(address))
            .await
            .map_err(|_| Refusal::Unreachable(target.host.clone()))?
            .map_err(|_| Refusal::Unreachable(target.host.clone()))?;
        Ok::<_, Refusal>((target, upstream))
    }
    .await;
    let (target, mut upstream) = match answer {
        Ok(found) => found,
        Err(refusal) => {
            let status = match refusal {
                Refusal::Bad(_) => "400 Bad Request",
                Refusal::Unreachable(_) => "502 Bad Gateway",
                _ => "403 Forbidden",
            };
            let body = format!("antler's shell proxy: {refusal}\n");
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(reply.as_bytes()).await;
            // Closed only once the client has had its answer and stopped sending: closing with
            // its bytes unread would reset the connection before it read the reason.
            let _ = client.shutdown().await;
            let mut sink = [0_u8; 4096];
            let drain = async { while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {} };
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            return Err(refusal);
        }
    };
    match &target.forward_head {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
        }
        Some(forward) => upstream.write_all(forward).await?,
    }
    upstream.write_all(&rest).await?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// The request head (through the blank line) and whatever came after it.
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 2048];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err(Refusal::Bad("the request head is too long".to_owned()));
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(Refusal::Bad("the request ended early".to_owned()));
        }
        buffer.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// Where `head` asks to go.
fn parse(head: &[u8]) -> Result<Target, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(Refusal::Bad("not an HTTP request".to_owned())),
    }
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return Err(Refusal::Bad("no request line".to_owned()));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)?;
        return Ok(Target {
            host,
            port,
            forward_head: None,
        });
    }
    let Some(after) = target.strip_prefix("http://") else {
        return Err(Refusal::Bad(
            "use an http:// URL, or CONNECT for https".to_owned(),
        ));
    };
    let (authority, path) = match after.find('/') {
        Some(at) => (&after[..at], &after[at..]),
        None => (after, "/"),
    };
    let (host, port) = split_authority(authority, Some(80))?;
    let mut forward = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        if name.starts_with("proxy-") {
            continue;
        }
        forward.extend_from_slice(header.name.as_bytes());
        forward.extend_from_slice(b": ");
        forward.extend_from_slice(header.value);
        forward.extend_from_slice(b"\r\n");
    }
    forward.extend_from_slice(b"\r\n");
    Ok(Target {
        host,
        port,
        forward_head: Some(forward),
    })
}

/// `host:port` (or `[v6]:port`), with `default` when the port is left out.
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), Refusal> {
    let bad = || {
        Refusal::Bad(format!(
            "bad host `{}`",
            authority.chars().take(100).collect::<String>()
        ))
    };
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port.parse::<u16>().map_err(|_| bad())?,
        None => default.ok_or_else(bad)?,
    };
    if host.is_empty() || host.contains(['@', '/', ' ']) {
        return Err(bad());
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// The one address of `host` to connect to: every address it resolves to must be public and
/// none of antler's own.
async fn resolve(host: &str, port: u16, policy: &Policy) -> Result<SocketAddr, Refusal> {
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| Refusal::Unreachable(host.to_owned()))?
            .map_err(|_| Refusal::Unreachable(host.to_owned()))?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(Refusal::Unreachable(host.to_owned()));
    }
    for address in &addresses {
        if policy.own.iter().any(|o| o.ip() == address.ip()) {
            return Err(Refusal::Own(host.to_owned()));
        }
        if !(policy.reachable)(address.ip()) {
            return Err(Refusal::NotPublic(host.to_owned()));
        }
    }
    addresses
        .into_iter()
        .next()
        .ok_or_else(|| Refusal::Unreachable(host.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_and_absolute_requests_name_their_target() {
        let connect =
            parse(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap();
        assert_eq!(
            connect,
            Target {
                host: "example.com".to_owned(),
                port: 443,
                forward_head: None
            }
        );
        let get = parse(
            b"GET http://Example.com/a/b?c=d HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!(get.host, "example.com");
        assert_eq!(get.port, 80);
        let forward = String::from_utf8(get.forward_head.unwrap()).unwrap();
        assert_eq!(
            forward,
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"
        );
        assert_eq!(
            parse(b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n")
                .unwrap()
                .host,
            "2001:db8::1"
        );
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET https://example.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT example.com HTTP/1.1\r\n\r\n",
            b"CONNECT user@example.com:443 HTTP/1.1\r\n\r\n",
            b"not http\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(Refusal::Bad(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[tokio::test]
    async fn only_public_addresses_that_are_not_antlers_are_reached() {
        let own = Policy {
            own: Box::new([SocketAddr::from(([203, 0, 114, 7], 8080))]),
            reachable: is_public,
        };
        for (host, refused) in [
            ("127.0.0.1", true),
            ("169.254.169.254", true),
            ("10.0.0.5", true),
            ("::ffff:127.0.0.1", true),
            ("fe80::1", true),
            ("203.0.114.7", true),
            ("93.184.216.34", false),
        ] {
            let result = resolve(host, 80, &own).await;
            assert_eq!(result.is_err(), refused, "{host}: {result:?}");
        }
        assert!(matches!(
            resolve("203.0.114.7", 80, &own).await,
            Err(Refusal::Own(_))
        ));
        assert!(matches!(
            resolve("localhost", 80, &own).await,
            Err(Refusal::NotPublic(_))
        ));
    }

    /// A client of `egress`'s TCP port sending `request`; everything it got back.
    async fn ask(port: u16, request: &str) -> String {
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        client.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn a_reachable_target_is_tunnelled_or_forwarded_byte_for_byte() {
        // The real policy only reaches public addresses, and tests reach none: here loopback
        // counts as reachable, everything else of the proxy is as served.
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (mut socket, _) = upstream.accept().await.unwrap();
                let mut got = vec![0_u8; 1024];
                let n = socket.read(&mut got).await.unwrap();
                seen.push(String::from_utf8_lossy(&got[..n]).into_owned());
                socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
                    )
                    .await
                    .unwrap();
            }
            seen
        });
        let dir = tempfile::tempdir().unwrap();
        let egress = Egress::start_with(dir.path().join("egress.sock"), Vec::new(), |ip| {
            ip.is_loopback()
        })
        .await
        .unwrap();
        let tunnelled = ask(
            egress.port(),
            &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\nHost: h\r\n\r\n"),
        )
        .await;
        assert!(
            tunnelled.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
            "{tunnelled}"
        );
        assert!(tunnelled.ends_with("hi"), "{tunnelled}");
        let forwarded = ask(
            egress.port(),
            &format!("GET http://127.0.0.1:{port}/x?y HTTP/1.1\r\nHost: h\r\nProxy-Authorization: z\r\n\r\n"),
        )
        .await;
        assert!(
            forwarded.starts_with("HTTP/1.1 200 OK") && forwarded.ends_with("hi"),
            "{forwarded}"
        );
        let seen = server.await.unwrap();
        assert_eq!(seen[0], "GET /t HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(
            seen[1], "GET /x?y HTTP/1.1\r\nHost: h\r\n\r\n",
            "origin-form, no proxy headers"
        );
    }

    #[tokio::test]
    async fn a_refused_target_is_answered_with_the_reason_and_never_connected() {
        let (server, port) = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            (listener, port)
        };
        let dir = tempfile::tempdir().unwrap();
        let egress = Egress::start(dir.path().join("egress.sock"), Vec::new())
            .await
            .unwrap();
        let answer = ask(
            egress.port(),
            &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
        assert!(
            answer.contains("127.0.0.1 is not a public address"),
            "{answer}"
        );
        // The loopback server was never reached.
        let accepted = tokio::time::timeout(Duration::from_millis(200), server.accept()).await;
        assert!(accepted.is_err(), "the proxy connected to loopback");
        // Through the Unix socket too.
        let mut unix = tokio::net::UnixStream::connect(dir.path().join("egress.sock"))
            .await
            .unwrap();
        unix.write_all(b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        unix.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    }
}
