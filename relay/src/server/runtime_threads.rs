//! The `runtime_threads` setting (`--runtime-threads cores|N`): how many single-threaded link
//! runtimes ([`execrelay_io::runtimes::LinkRuntimes`]) the `execrelay-relay` binary runs its
//! links on. It only parses, shows and resolves the value; the binary starts the runtimes.

use execrelay_io::runtimes::{available_cores, MAX_RUNTIME_THREADS};

/// How many link runtimes: one per available core (the default), or a number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RuntimeThreads {
    /// One per CPU this process may run on (`std::thread::available_parallelism`: cgroup
    /// quota and affinity included).
    #[default]
    Cores,
    /// This many, 1 to [`MAX_RUNTIME_THREADS`].
    Count(usize),
}

impl RuntimeThreads {
    /// The number of runtimes to start.
    pub fn resolve(self) -> usize {
        match self {
            RuntimeThreads::Cores => available_cores(),
            RuntimeThreads::Count(n) => n,
        }
    }

    fn count(n: u64) -> Result<RuntimeThreads, String> {
        match usize::try_from(n) {
            Ok(n) if (1..=MAX_RUNTIME_THREADS).contains(&n) => Ok(RuntimeThreads::Count(n)),
            _ => Err(format!(
                "{n} runtime threads: expected `cores` or a number from 1 to {MAX_RUNTIME_THREADS}"
            )),
        }
    }
}

impl std::fmt::Display for RuntimeThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeThreads::Cores => f.write_str("cores"),
            RuntimeThreads::Count(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for RuntimeThreads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("cores") {
            return Ok(RuntimeThreads::Cores);
        }
        match s.parse::<u64>() {
            Ok(n) => RuntimeThreads::count(n),
            Err(_) => Err(format!(
                "{s:?}: expected `cores` or a number from 1 to {MAX_RUNTIME_THREADS}"
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for RuntimeThreads {
    /// `"cores"` or a number, as the flag.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Given {
            Number(i64),
            Word(String),
        }
        let named = |e: String| {
            serde::de::Error::custom(format!("runtime_threads (--runtime-threads): {e}"))
        };
        match Given::deserialize(d).map_err(|_: D::Error| {
            named(format!(
                "expected \"cores\" or a number from 1 to {MAX_RUNTIME_THREADS}"
            ))
        })? {
            Given::Number(n) => RuntimeThreads::count(u64::try_from(n).unwrap_or(0)).map_err(named),
            Given::Word(w) => w.parse().map_err(named),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_or_a_bounded_number() {
        assert_eq!("cores".parse(), Ok(RuntimeThreads::Cores));
        assert_eq!(" Cores ".parse(), Ok(RuntimeThreads::Cores));
        assert_eq!("1".parse(), Ok(RuntimeThreads::Count(1)));
        assert_eq!(
            MAX_RUNTIME_THREADS.to_string().parse(),
            Ok(RuntimeThreads::Count(MAX_RUNTIME_THREADS))
        );
        for bad in ["0", "257", "99999999999999999999", "-1", "many", ""] {
            let e = bad.parse::<RuntimeThreads>().unwrap_err();
            assert!(
                e.contains(&format!("from 1 to {MAX_RUNTIME_THREADS}")),
                "{bad}: {e}"
            );
        }
        assert_eq!(RuntimeThreads::Count(3).resolve(), 3);
        let cores = RuntimeThreads::Cores.resolve();
        assert!((1..=MAX_RUNTIME_THREADS).contains(&cores));
        assert_eq!(RuntimeThreads::Cores.to_string(), "cores");
        assert_eq!(RuntimeThreads::Count(4).to_string(), "4");
    }

    #[test]
    fn toml_takes_a_number_or_cores_and_names_the_key() {
        #[derive(serde::Deserialize)]
        struct T {
            runtime_threads: RuntimeThreads,
        }
        let t: T = toml::from_str("runtime_threads = 2").unwrap();
        assert_eq!(t.runtime_threads, RuntimeThreads::Count(2));
        let t: T = toml::from_str("runtime_threads = \"cores\"").unwrap();
        assert_eq!(t.runtime_threads, RuntimeThreads::Cores);
        for bad in [
            "runtime_threads = 0",
            "runtime_threads = 100000",
            "runtime_threads = -3",
            "runtime_threads = \"lots\"",
            "runtime_threads = 1.5",
        ] {
            let e = toml::from_str::<T>(bad).err().unwrap().to_string();
            assert!(
                e.contains("runtime_threads (--runtime-threads)"),
                "{bad}: {e}"
            );
        }
    }
}
