//! Capture (placeholder while the soak is built).
#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {}
pub async fn run(_a: CaptureArgs) -> anyhow::Result<i32> {
    Ok(0)
}
