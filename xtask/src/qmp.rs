//! QMP (QEMU's machine protocol) requests from the guest.
//!
//! A run with a QMP socket (the vfio run; [`RunKind::has_qmp`]) lets the
//! guest ask for machine changes it cannot make itself, such as
//! hot-unplugging a device. The guest prints one console line
//!
//! ```text
//! VMTEST-QMP <command> [<arguments as one JSON object>]
//! VMTEST-QMP device_del {"id":"crypto1"}
//! ```
//!
//! and the host sends `{"execute": <command>, "arguments": <object>}` on the
//! socket (connecting and doing the `qmp_capabilities` handshake at the first
//! request), then logs `# QMP <command>: <reply>` in the run's log and every
//! QMP event as `# QMP event <NAME> at <seconds> s: <data>` (seconds on the
//! log's clock, since QEMU started). Nothing is written back to the
//! guest: it watches for the effect in sysfs (e.g. the device's folder going
//! away). A malformed request, a failed connection and an error reply fail
//! the run.
//!
//! [`RunKind::has_qmp`]: crate::qemu::RunKind::has_qmp

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, ErrorKind, Write as _};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

/// The console marker of a request.
pub const MARKER: &str = "VMTEST-QMP";
/// How long connecting, the handshake and writing a request may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest path a Unix socket address holds (`sun_path`, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// One request from the guest.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The QMP command (`device_del`, `query-pci`, ...).
    pub command: String,
    /// Its arguments, if the line had any.
    pub arguments: Option<Map<String, Value>>,
}

impl Request {
    /// The QMP message for this request, tagged with `id` for its reply.
    pub fn message(&self, id: u64) -> Value {
        let mut message = Map::new();
        message.insert("execute".into(), Value::String(self.command.clone()));
        if let Some(arguments) = &self.arguments {
            message.insert("arguments".into(), Value::Object(arguments.clone()));
        }
        message.insert("id".into(), Value::from(id));
        Value::Object(message)
    }
}

/// The request in a console line: `None` if the line has no `VMTEST-QMP`
/// marker, else the request or why it is malformed. The marker may follow
/// kernel text on the same line; text after the JSON object is ignored (the
/// kernel can append its own messages to a console line).
pub fn parse_request(line: &str) -> Option<Result<Request, String>> {
    let start = line.find(MARKER)?;
    let rest = &line[start + MARKER.len()..];
    if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
        return None; // another marker that starts the same way
    }
    let rest = rest.trim_start();
    let (command, arguments) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(command, arguments)| {
            (command, arguments.trim())
        });
    if command.is_empty() {
        return Some(Err("no command".into()));
    }
    if !command
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Some(Err(format!("{command:?} is not a QMP command name")));
    }
    let arguments = if arguments.is_empty() {
        None
    } else {
        let mut values = serde_json::Deserializer::from_str(arguments).into_iter::<Value>();
        match values.next() {
            Some(Ok(Value::Object(object))) => Some(object),
            Some(Ok(other)) => {
                return Some(Err(format!(
                    "the arguments of {command} are not a JSON object: {other}"
                )));
            }
            Some(Err(error)) => {
                return Some(Err(format!(
                    "the arguments of {command} are not JSON ({error}): {arguments}"
                )));
            }
            None => None,
        }
    };
    Some(Ok(Request {
        command: command.to_owned(),
        arguments,
    }))
}

/// Where a run's QMP socket goes: `<dir>/<run>.qmp`, or the temporary
/// folder when that path is too long for a Unix socket address (or is not
/// UTF-8, which QEMU's command line cannot carry).
pub fn socket_path(dir: &Path, run: &str) -> PathBuf {
    let path = dir.join(format!("{run}.qmp"));
    match path.to_str() {
        Some(text) if text.len() <= MAX_SOCKET_PATH => path,
        _ => std::env::temp_dir().join(format!("xtask-vm-test-{}-{run}.qmp", std::process::id())),
    }
}

/// What a message from QEMU is, for the run's log.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The reply to a request: its command, the reply without its `id`,
    /// and the error's description if it failed.
    Reply {
        /// The command it answers.
        command: String,
        /// `{"return": ...}` or `{"error": ...}`.
        reply: Value,
        /// The error's `desc` (or the whole error) for an error reply.
        error: Option<String>,
    },
    /// An asynchronous event (e.g. `DEVICE_DELETED`).
    Event {
        /// Its name.
        name: String,
        /// Its `data`, `null` if none.
        data: Value,
    },
    /// Anything else (a reply to nothing sent, a line that is not JSON).
    Other(Value),
}

/// A connection to a QEMU's QMP socket, past the handshake. A thread reads
/// QEMU's messages and hands each to the `forward` callback given to
/// [`Client::connect`]; [`Client::classify`] then matches replies to
/// requests.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    next_id: u64,
    /// Commands sent and not answered yet, by id.
    pending: BTreeMap<u64, String>,
    reader: Option<JoinHandle<()>>,
}

impl Client {
    /// Connects to `path` (retrying until `timeout` while QEMU has not
    /// created it), reads the greeting, negotiates capabilities and starts
    /// the reader thread. Messages that are not JSON reach `forward` as
    /// JSON strings; the thread stops at the end of the stream or when
    /// `forward` returns false.
    pub fn connect(
        path: &Path,
        timeout: Duration,
        mut forward: impl FnMut(Value) -> bool + Send + 'static,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(stream) => break stream,
                Err(error)
                    if matches!(
                        error.kind(),
                        ErrorKind::NotFound | ErrorKind::ConnectionRefused
                    ) && Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("connecting to {}", path.display()));
                }
            }
        };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let greeting = read_message(&mut reader).context("reading QMP's greeting")?;
        if greeting.get("QMP").is_none() {
            bail!("QMP greeting expected, got {greeting}");
        }
        let mut client = Self {
            stream,
            next_id: 1,
            pending: BTreeMap::new(),
            reader: None,
        };
        client.write(&serde_json::json!({ "execute": "qmp_capabilities" }))?;
        loop {
            let reply = read_message(&mut reader).context("reading qmp_capabilities' reply")?;
            if reply.get("return").is_some() {
                break;
            }
            if let Some(error) = reply.get("error") {
                bail!("qmp_capabilities failed: {error}");
            }
            // An event before the reply: nothing to do with the handshake.
            if !forward(reply) {
                break;
            }
        }
        // Replies may take as long as QEMU needs; the thread ends with the stream.
        client.stream.set_read_timeout(None)?;
        client.reader = Some(thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                let text = line.trim();
                if !text.is_empty() {
                    let message = serde_json::from_str(text)
                        .unwrap_or_else(|_| Value::String(text.to_owned()));
                    if !forward(message) {
                        return;
                    }
                }
                line.clear();
            }
        }));
        Ok(client)
    }

    /// Sends a request; its reply comes later through `forward`.
    pub fn send(&mut self, request: &Request) -> Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&request.message(id))?;
        self.pending.insert(id, request.command.clone());
        Ok(())
    }

    fn write(&mut self, message: &Value) -> Result<()> {
        let mut text = message.to_string();
        text.push('\n');
        self.stream
            .write_all(text.as_bytes())
            .context("writing to the QMP socket")
    }

    /// What a forwarded message is; a reply is matched to its request by id.
    pub fn classify(&mut self, message: Value) -> Incoming {
        let Value::Object(mut object) = message else {
            return Incoming::Other(message);
        };
        if let Some(Value::String(name)) = object.get("event") {
            return Incoming::Event {
                name: name.clone(),
                data: object.get("data").cloned().unwrap_or(Value::Null),
            };
        }
        let command = object
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| self.pending.remove(&id));
        match command {
            Some(command) if object.contains_key("return") || object.contains_key("error") => {
                object.remove("id");
                let error = object.get("error").map(|error| {
                    error
                        .get("desc")
                        .and_then(Value::as_str)
                        .map_or_else(|| error.to_string(), str::to_owned)
                });
                Incoming::Reply {
                    command,
                    reply: Value::Object(object),
                    error,
                }
            }
            _ => Incoming::Other(Value::Object(object)),
        }
    }

    /// Waits for the reader thread (QEMU must have exited, which ends the
    /// stream) and returns the commands that got no reply.
    pub fn finish(mut self) -> Vec<String> {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        std::mem::take(&mut self.pending).into_values().collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            // Not finished: end the stream so the thread cannot outlive us.
            let _ = self.stream.shutdown(Shutdown::Both);
            let _ = reader.join();
        }
    }
}

/// Reads one JSON line.
fn read_message(reader: &mut impl std::io::BufRead) -> Result<Value> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        bail!("the QMP socket closed");
    }
    serde_json::from_str(line.trim()).with_context(|| format!("QMP sent {:?}", line.trim()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    use serde_json::json;

    use super::*;

    #[test]
    fn requests_are_parsed_from_console_lines() {
        assert_eq!(parse_request("VMTEST-BEGIN x"), None);
        assert_eq!(parse_request("VMTEST-QMPX a"), None);
        assert_eq!(
            parse_request(r#"VMTEST-QMP device_del {"id":"crypto1"}"#),
            Some(Ok(Request {
                command: "device_del".into(),
                arguments: Some(json!({"id": "crypto1"}).as_object().unwrap().clone()),
            }))
        );
        // After kernel text, with blanks inside the JSON and kernel text after it.
        assert_eq!(
            parse_request(
                r#"[  7.1] pcieport 0000:00:02.0: fooVMTEST-QMP   device_add { "driver": "virtio-crypto-pci", "id": "c2" } [  7.2] more"#
            ),
            Some(Ok(Request {
                command: "device_add".into(),
                arguments: Some(
                    json!({"driver": "virtio-crypto-pci", "id": "c2"})
                        .as_object()
                        .unwrap()
                        .clone()
                ),
            }))
        );
        assert_eq!(
            parse_request("VMTEST-QMP query-status"),
            Some(Ok(Request {
                command: "query-status".into(),
                arguments: None,
            }))
        );
        assert_eq!(
            parse_request("VMTEST-QMP query-status   "),
            Some(Ok(Request {
                command: "query-status".into(),
                arguments: None,
            }))
        );
    }

    #[test]
    fn malformed_requests_say_why() {
        let error = |line| parse_request(line).unwrap().unwrap_err();
        assert_eq!(error("VMTEST-QMP"), "no command");
        assert_eq!(error("VMTEST-QMP   "), "no command");
        assert!(error("VMTEST-QMP {\"id\":1}").contains("not a QMP command name"));
        assert!(error("VMTEST-QMP device_del [1]").contains("not a JSON object"));
        assert!(error("VMTEST-QMP device_del {id:crypto1}").contains("not JSON"));
        assert!(error(r#"VMTEST-QMP device_del {"id":"crypto1""#).contains("not JSON"));
    }

    #[test]
    fn the_message_carries_the_arguments_and_the_id() {
        let request = parse_request(r#"VMTEST-QMP device_del {"id":"crypto1"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            request.message(7),
            json!({"execute": "device_del", "arguments": {"id": "crypto1"}, "id": 7})
        );
        let bare = parse_request("VMTEST-QMP query-status").unwrap().unwrap();
        assert_eq!(bare.message(1), json!({"execute": "query-status", "id": 1}));
    }

    #[test]
    fn long_socket_paths_move_to_the_temporary_folder() {
        assert_eq!(
            socket_path(Path::new("/w/target/vm-test"), "vfio"),
            Path::new("/w/target/vm-test/vfio.qmp")
        );
        let long = Path::new("/").join("d".repeat(120));
        let path = socket_path(&long, "vfio");
        assert!(path.starts_with(std::env::temp_dir()), "{}", path.display());
        assert!(path.to_str().unwrap().ends_with("-vfio.qmp"));
    }

    /// A fake QEMU: greets, answers the handshake, then answers each command
    /// after an event, `device_del` of an unknown id with an error.
    fn fake_qmp_server(listener: UnixListener) -> JoinHandle<Vec<Value>> {
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            // The client may be gone before the last answers: ignore that.
            let mut send = |value: Value| {
                let _ = writeln!(writer, "{value}");
            };
            send(json!({"QMP": {"version": {}, "capabilities": []}}));
            let mut received = Vec::new();
            for line in BufReader::new(stream).lines() {
                let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
                let id = message.get("id").cloned();
                match message["execute"].as_str().unwrap() {
                    "qmp_capabilities" => {
                        // An event before the handshake's reply is passed on.
                        send(json!({"event": "RESUME", "timestamp": {}}));
                        send(json!({"return": {}}));
                    }
                    "device_del" if message["arguments"]["id"] == "crypto1" => {
                        send(json!({"return": {}, "id": id}));
                        send(json!({"event": "DEVICE_DELETED", "data": {"device": "crypto1"}}));
                    }
                    _ => send(
                        json!({"error": {"class": "DeviceNotFound", "desc": "Device 'x' not found"}, "id": id}),
                    ),
                }
                received.push(message);
            }
            received
        })
    }

    #[test]
    fn the_client_handshakes_sends_and_matches_replies() {
        let dir = std::env::temp_dir().join(format!("xtask-qmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = socket_path(&dir, "t");
        let server = fake_qmp_server(UnixListener::bind(&path).unwrap());
        let (sender, messages) = mpsc::channel();
        let mut client =
            Client::connect(&path, IO_TIMEOUT, move |m| sender.send(m).is_ok()).unwrap();
        let next = || messages.recv_timeout(IO_TIMEOUT).unwrap();

        let first = next();
        assert_eq!(
            client.classify(first),
            Incoming::Event {
                name: "RESUME".into(),
                data: Value::Null
            }
        );
        let del = |id: &str| {
            parse_request(&format!(r#"VMTEST-QMP device_del {{"id":"{id}"}}"#))
                .unwrap()
                .unwrap()
        };
        client.send(&del("crypto1")).unwrap();
        let reply = next();
        assert_eq!(
            client.classify(reply),
            Incoming::Reply {
                command: "device_del".into(),
                reply: json!({"return": {}}),
                error: None
            }
        );
        let event = next();
        assert_eq!(
            client.classify(event),
            Incoming::Event {
                name: "DEVICE_DELETED".into(),
                data: json!({"device": "crypto1"})
            }
        );
        client.send(&del("x")).unwrap();
        let reply = next();
        let Incoming::Reply { command, error, .. } = client.classify(reply) else {
            panic!("not a reply");
        };
        assert_eq!(command, "device_del");
        assert_eq!(error.as_deref(), Some("Device 'x' not found"));
        // A reply to nothing sent is not taken for one.
        assert!(matches!(
            client.classify(json!({"return": {}, "id": 99})),
            Incoming::Other(_)
        ));
        client.send(&del("crypto1")).unwrap();
        // Dropping the client ends the connection; the server sees all three.
        drop(client);
        let received = server.join().unwrap();
        assert_eq!(received.len(), 4, "{received:?}");
        assert_eq!(received[1]["id"], 1);
        assert_eq!(received[3]["id"], 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finish_reports_unanswered_requests() {
        let dir = std::env::temp_dir().join(format!("xtask-qmp-finish-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = socket_path(&dir, "t");
        let listener = UnixListener::bind(&path).unwrap();
        // A QEMU that greets, negotiates, reads one command and exits.
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            writeln!(writer, "{}", json!({"QMP": {}})).unwrap();
            let mut lines = BufReader::new(stream).lines();
            lines.next().unwrap().unwrap();
            writeln!(writer, "{}", json!({"return": {}})).unwrap();
            lines.next().unwrap().unwrap();
        });
        let mut client = Client::connect(&path, IO_TIMEOUT, |_| true).unwrap();
        client
            .send(&parse_request("VMTEST-QMP quit").unwrap().unwrap())
            .unwrap();
        server.join().unwrap();
        assert_eq!(client.finish(), ["quit"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_socket_is_an_error_after_the_timeout() {
        let path = std::env::temp_dir().join(format!("xtask-qmp-none-{}.qmp", std::process::id()));
        let started = Instant::now();
        let error = Client::connect(&path, Duration::from_millis(200), |_| true).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(format!("{error:#}").contains("connecting to"), "{error:#}");
    }
}
