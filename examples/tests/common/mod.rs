//! Starting and stopping the server binaries for the integration tests.

#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server process, killed on drop.
pub struct Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    /// The thread collecting stderr: done once the process has exited and
    /// the pipe is drained.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts `bin` with `args` (plus `--listen 127.0.0.1:0`) and waits for
    /// its `listening on ADDR` line.
    pub fn start(bin: &str, args: &[&str]) -> Server {
        let mut all = args.to_vec();
        all.extend(["--listen", "127.0.0.1:0"]);
        Server::start_exactly(bin, &all)
    }

    /// Starts `bin` with `args` as they are and waits for its `listening on
    /// ADDR` line.
    pub fn start_exactly(bin: &str, args: &[&str]) -> Server {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let collected = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                collected
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("{bin} did not start: {}", stderr.lock().unwrap())
            });
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Server {
            child,
            addr,
            stderr,
            reader: Some(reader),
        }
    }

    /// What the server wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its stderr once it contains `needle` (the reader thread may lag the
    /// `listening on` line on stdout), or as it is after `limit`.
    pub fn stderr_with(&self, needle: &str, limit: Duration) -> String {
        let started = Instant::now();
        loop {
            let text = self.stderr();
            if text.contains(needle) || started.elapsed() > limit {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then waits (at most 30 s) for the exit.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.wait(Duration::from_secs(30));
        // The process is gone: the reader reaches the pipe's end.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        (status, self.stderr())
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the server did not stop: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a load generator binary to its end; its success and stdout.
pub fn run_load(bin: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a server binary that must refuse to start: its exit status and
/// stderr (it is killed, and the test fails, if it is still running after
/// 30 s).
pub fn refused(bin: &str, args: &[&str]) -> (ExitStatus, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("{bin} {args:?} did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

/// Checks that `bin` (with `args`) refuses every non-loopback `--listen`
/// address, saying why and naming `--insecure-listen`, and that with
/// `--insecure-listen` it starts and warns what it exposes (`exposes`
/// names it); the address it is given there is loopback all the same, so
/// that nothing is opened beyond this machine.
pub fn listens_on_loopback_only(bin: &str, args: &[&str], exposes: &str) {
    for addr in [
        "0.0.0.0:0",
        "[::]:0",
        "192.0.2.1:7700",
        "[::ffff:10.0.0.1]:7700",
    ] {
        let mut all = args.to_vec();
        all.extend(["--listen", addr]);
        let (status, stderr) = refused(bin, &all);
        assert!(!status.success(), "{addr}: {stderr}");
        assert!(
            stderr.contains("is not a loopback address") && stderr.contains("--insecure-listen"),
            "{addr}: {stderr}"
        );
    }
    for addr in ["127.0.0.1:0", "127.3.4.5:0"] {
        let mut all = args.to_vec();
        all.extend(["--listen", addr]);
        let server = Server::start_exactly(bin, &all);
        assert!(server.addr.ip().is_loopback());
        std::net::TcpStream::connect(server.addr).unwrap();
        let (status, stderr) = server.terminate();
        assert!(status.success(), "{stderr}");
        assert!(!stderr.contains("--insecure-listen"), "{stderr}");
    }
    let mut all = args.to_vec();
    all.extend(["--insecure-listen", "127.0.0.1:0"]);
    let server = Server::start_exactly(bin, &all);
    let said = server.stderr_with(exposes, Duration::from_secs(10));
    assert!(
        said.contains("WARN") && said.contains("--insecure-listen") && said.contains(exposes),
        "{said}"
    );
    drop(server);
}
