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
