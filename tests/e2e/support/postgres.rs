//! A schema of its own on the PostgreSQL test server, for the tests that run antler on
//! PostgreSQL: named by `ANTLER_TEST_DATABASE_URL` (or `DATABASE_URL`); without one, the tests
//! say so and pass.

/// The `[store] lease_secs` of the replicas [`Schema::store_config_leased`] configures for
/// the chaos test, whose takeovers wait for it.
pub const LEASE_SECS: u64 = 3;
/// The `[store] lease_secs` of [`Schema::store_config`]: tests that stop replicas cleanly
/// (their conversations move at once) and must not lose a replica to a late renewal on a
/// loaded machine.
const CALM_LEASE_SECS: u64 = 15;

/// A schema of its own on the test server, dropped by [`Schema::drop`] (a failed test leaves
/// it behind to look at).
pub struct Schema {
    server: String,
    name: String,
}

impl Schema {
    /// A fresh schema, or `None` (after saying why) when no server is named.
    pub async fn create() -> Option<Self> {
        let Some(server) = std::env::var("ANTLER_TEST_DATABASE_URL")
            .or_else(|_| std::env::var("DATABASE_URL"))
            .ok()
            .filter(|url| !url.is_empty())
        else {
            eprintln!("skipped: set ANTLER_TEST_DATABASE_URL to run the PostgreSQL tests");
            return None;
        };
        let name = format!("e2e_{}", uuid::Uuid::now_v7().simple());
        run_sql(&server, &format!("CREATE SCHEMA {name}")).await;
        Some(Self { server, name })
    }

    /// The server's URL with this schema first on the `search_path`.
    pub fn url(&self) -> String {
        let join = if self.server.contains('?') { '&' } else { '?' };
        format!("{}{join}options=-csearch_path%3D{}", self.server, self.name)
    }

    /// [`Schema::url`] reaching the server through `proxy` (its address in place of the
    /// server's `host:port`), or `None` when the URL names no `host:port` this can replace.
    pub fn url_through(&self, proxy: std::net::SocketAddr) -> Option<String> {
        let url = self.url();
        let (scheme, rest) = url.split_once("://")?;
        let (credentials, rest) = match rest.split_once('@') {
            Some((credentials, rest)) => (format!("{credentials}@"), rest),
            None => (String::new(), rest),
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        Some(format!("{scheme}://{credentials}{proxy}{}", &rest[end..]))
    }

    /// The server's `host:port`, from its URL.
    pub fn server_address(&self) -> Option<String> {
        let rest = self.server.split_once("://")?.1;
        let rest = rest.split_once('@').map_or(rest, |(_, rest)| rest);
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        Some(rest[..end].to_owned())
    }

    /// The `[store]` table of an antler on this schema named `replica`.
    pub fn store_config(&self, replica: &str) -> String {
        self.store_config_leased(replica, CALM_LEASE_SECS)
    }

    /// [`Schema::store_config`] with `lease_secs` of `lease`.
    pub fn store_config_leased(&self, replica: &str, lease: u64) -> String {
        format!(
            "[store]\nbackend = \"postgres\"\nurl = {:?}\nlease_secs = {lease}\nreplica = {replica:?}\n",
            self.url()
        )
    }

    /// The rows `sql` selects in this schema.
    pub async fn query(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        let connection = tokio::spawn(connection);
        let rows = client.query(sql, &[]).await.expect(sql);
        drop(client);
        let _ = connection.await;
        rows
    }

    pub async fn drop(self) {
        run_sql(
            &self.server,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        )
        .await;
    }
}

async fn run_sql(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    let connection = tokio::spawn(connection);
    client.batch_execute(sql).await.expect(sql);
    drop(client);
    let _ = connection.await;
}

/// A TCP proxy to the database that can be cut (every connection closed, new ones refused)
/// and mended: a database outage, as antler sees it.
pub struct Outage {
    pub address: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Outage {
    /// A proxy on 127.0.0.1 forwarding to `server` (`host:port`).
    pub async fn start(server: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    continue;
                }
                let mut watch = watch.clone();
                let server = server.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(&server).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { address, cut }
    }

    /// Closes every connection and refuses new ones, until [`Outage::mend`].
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    pub fn mend(&self) {
        let _ = self.cut.send(false);
    }
}
