//! The load benchmark (placeholder while the soak is built).
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {}
pub async fn run(_a: LoadArgs) -> anyhow::Result<i32> {
    Ok(0)
}
