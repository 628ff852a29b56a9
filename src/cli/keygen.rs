//! `execrelay keygen`: make a key pair (the default client key when no `-o`), refuse to
//! overwrite one without `--force`; `-l -f FILE` prints a key's fingerprint in the logs' own
//! format (from a private or a public key), `-y -f PRIVATE` its public key line.

use std::path::{Path, PathBuf};

use clap::Args;

use super::failure::Failure;
use crate::noise::keys::{fingerprint, pub_path, public_line, KeyFile, Keypair};

/// Flags of `execrelay keygen`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  execrelay keygen                         this client's key: ~/.config/execrelay/id (and id.pub)
  execrelay keygen -o server -c web-1      server (0600) and server.pub
  execrelay keygen -l -f server.pub        its fingerprint, as the logs show it
  execrelay keygen -y -f server            the public key line of a private key")]
pub struct KeygenArgs {
    /// Where to write the private key (mode 0600); the public key goes to NAME.pub
    /// [default: ~/.config/execrelay/id, this client's key].
    #[arg(short = 'o', long = "output", value_name = "NAME", conflicts_with_all = ["fingerprint", "public"])]
    pub output: Option<PathBuf>,
    /// Comment on the public key line [default: user@host].
    // The brackets are clap's help convention, not a link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(short = 'c', long)]
    pub comment: Option<String>,
    /// Overwrite NAME and NAME.pub if they exist.
    #[arg(long, conflicts_with = "if_missing")]
    pub force: bool,
    /// Do nothing (and succeed) when NAME exists already: for a service's first start, as
    /// sshd makes its host keys.
    #[arg(long)]
    pub if_missing: bool,
    /// Print the fingerprint of the key in FILE (private or public), as the logs name keys.
    #[arg(short = 'l', requires = "file", conflicts_with = "public")]
    pub fingerprint: bool,
    /// Print the public key line of the private key in FILE.
    #[arg(short = 'y', requires = "file")]
    pub public: bool,
    /// The key file for -l and -y.
    #[arg(short = 'f', value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// Run `keygen`; the exit status.
pub fn main(args: KeygenArgs) -> i32 {
    match keygen(args) {
        Ok(()) => 0,
        Err(f) => f.report(),
    }
}

fn keygen(args: KeygenArgs) -> Result<(), Failure> {
    if let Some(file) = &args.file {
        if !(args.fingerprint || args.public) {
            return Err(Failure::usage(
                "-f goes with -l (fingerprint) or -y (public key)",
            ));
        }
        let key = Keypair::read_any(file).map_err(|e| Failure::cause(e.to_string()))?;
        if args.fingerprint {
            let comment = match &key {
                KeyFile::Public { comment, .. } => comment.clone(),
                KeyFile::Private(_) => String::new(),
            };
            let line = format!("{} {}", fingerprint(&key.public()), comment);
            println!("{}", line.trim_end());
            return Ok(());
        }
        let KeyFile::Private(kp) = key else {
            return Err(Failure::cause(format!(
                "{}: this is a public key already; -y needs the private key",
                file.display()
            )));
        };
        println!(
            "{}",
            public_line(&kp.public, &args.comment.unwrap_or_default())
        );
        return Ok(());
    }
    let named = args.output.is_some();
    let output = match args.output {
        Some(p) => p,
        None => {
            let p = super::hosts::default_key_path().ok_or_else(|| {
                Failure::usage("no HOME or XDG_CONFIG_HOME for the default key: give -o NAME")
            })?;
            if let Some(dir) = p.parent() {
                create_private_dir(dir)?;
            }
            p
        }
    };
    let comment = args.comment.unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "host".into());
        format!("{user}@{host}")
    });
    if args.if_missing && output.symlink_metadata().is_ok() {
        eprintln!("execrelay keygen: {} exists; kept", output.display());
        return Ok(());
    }
    let public = pub_path(&output);
    let taken: Vec<&Path> = [output.as_path(), public.as_path()]
        .into_iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    if !taken.is_empty() {
        if !args.force {
            return Err(Failure::cause(format!(
                "{}{} exists: not overwritten (--force replaces {} and {})",
                if named { "-o " } else { "" },
                taken[0].display(),
                output.display(),
                public.display()
            )));
        }
        for p in taken {
            std::fs::remove_file(p).map_err(|e| Failure::cause(format!("{}: {e}", p.display())))?;
        }
    }
    let kp = Keypair::generate().map_err(|e| Failure::cause(e.to_string()))?;
    kp.write(&output, &comment)
        .map_err(|e| Failure::cause(e.to_string()))?;
    println!("{}", public_line(&kp.public, &comment));
    eprintln!(
        "execrelay: wrote {} (private, 0600) and {}; fingerprint {}",
        output.display(),
        public.display(),
        fingerprint(&kp.public)
    );
    Ok(())
}

/// `dir` and its parents, the last one mode 0700 when made here.
fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Failure::cause(format!("{}: {e}", dir.display())))
}
