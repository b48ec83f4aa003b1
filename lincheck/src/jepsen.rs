//! Jepsen's etcd register log (the format of Porcupine's `test_data/jepsen/etcd_NNN.log`),
//! read as Porcupine's `parseJepsenLog` reads it:
//!
//! ```text
//! INFO  jepsen.util - 3 :invoke :cas [3 0]
//! INFO  jepsen.util - 3 :ok :cas [3 0]
//! ```
//!
//! (tab-separated after the process). One operation per process at a time: `:invoke` opens it, `:ok`, `:fail` or `:info` closes
//! it. `:ok` reads, writes and cas, and `:fail` cas (the comparison did not hold) are
//! answers; `:fail :read` (timed out) and `:info :read` say nothing and are left out, as is a
//! `:fail :write` (not applied); `:info` on a write or cas, and an invocation never
//! completed, have an unknown outcome (return time infinity). An operation's times are the
//! line numbers of its invocation and completion.
//!
//! Lines of other loggers (`LEVEL logger - ...`), of processes that are not numbers
//! (`:nemesis`), indented continuation lines and blank lines are skipped; any other line, a
//! malformed `jepsen.util` record, or a completion that matches no invocation is an error.

use crate::error::{InputError, numbered_lines};
use crate::model::register::{RegisterInput, RegisterOutput};
use crate::search::Operation;
use std::collections::HashMap;

/// An operation of a Jepsen register history.
pub type JepsenOp = Operation<RegisterInput, RegisterOutput>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum F {
    Read,
    Write,
    Cas,
}

impl F {
    fn name(self) -> &'static str {
        match self {
            F::Read => ":read",
            F::Write => ":write",
            F::Cas => ":cas",
        }
    }
}

struct Pending {
    line: usize,
    f: F,
    /// Index into the operations being built.
    index: usize,
}

const LEVELS: [&str; 7] = [
    "TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "FATAL",
];

/// Parses a Jepsen etcd register log named `file`.
pub fn parse_jepsen(file: &str, input: &[u8]) -> Result<Vec<JepsenOp>, InputError> {
    let mut ops: Vec<Option<JepsenOp>> = Vec::new();
    let mut open: HashMap<u64, Pending> = HashMap::new();
    let mut records = 0usize;
    for line in numbered_lines(file, input) {
        let (n, text) = line?;
        let err = |message: String| InputError::line(file, n, message);
        let tokens: Vec<&str> = text.split_whitespace().collect();
        let Some(&first) = tokens.first() else {
            continue;
        };
        let is_record = tokens.len() >= 3 && tokens[1] == "jepsen.util" && tokens[2] == "-";
        if !is_record {
            let other_logger = LEVELS.contains(&first) && tokens.len() >= 3 && tokens[2] == "-";
            if other_logger || text.starts_with(char::is_whitespace) {
                continue;
            }
            return Err(err(format!(
                "not a line of a Jepsen log (expected `INFO  jepsen.util - PROCESS :TYPE :F VALUE`): {}",
                excerpt(text)
            )));
        }
        if tokens.len() < 6 {
            return Err(err(format!(
                "a jepsen.util record needs a process, a type and a function: {}",
                excerpt(text)
            )));
        }
        if tokens[3].starts_with(':') {
            continue; // :nemesis and other non-client processes
        }
        let process: u64 = tokens[3]
            .parse()
            .map_err(|_| err(format!("process {:?} is not a number", tokens[3])))?;
        let f = match tokens[5] {
            ":read" => F::Read,
            ":write" => F::Write,
            ":cas" => F::Cas,
            other => {
                return Err(err(format!(
                    "unknown function {other:?} (expected :read, :write or :cas)"
                )));
            }
        };
        let value = tokens[6..].join(" ");
        records += 1;
        match tokens[4] {
            ":invoke" => {
                if let Some(p) = open.get(&process) {
                    return Err(err(format!(
                        "process {process} invokes again while its operation of line {} is open",
                        p.line
                    )));
                }
                let input = match f {
                    F::Read if value == "nil" => RegisterInput::Read,
                    F::Read => return Err(err(format!("a read invokes with {value:?}, not nil"))),
                    F::Write => RegisterInput::Write(int(&value).map_err(err)?),
                    F::Cas => {
                        let (from, to) = pair(&value).map_err(err)?;
                        RegisterInput::Cas { from, to }
                    }
                };
                open.insert(
                    process,
                    Pending {
                        line: n,
                        f,
                        index: ops.len(),
                    },
                );
                ops.push(Some(Operation {
                    id: ops.len() as u64,
                    client: process,
                    call: n as u64,
                    ret: None,
                    input,
                    output: RegisterOutput::Unknown,
                }));
            }
            kind @ (":ok" | ":fail" | ":info") => {
                let p = open.remove(&process).ok_or_else(|| {
                    err(format!(
                        "process {process} completes an operation it never invoked"
                    ))
                })?;
                if p.f != f {
                    return Err(err(format!(
                        "process {process} completes {} but invoked {} on line {}",
                        f.name(),
                        p.f.name(),
                        p.line
                    )));
                }
                let slot = ops
                    .get_mut(p.index)
                    .ok_or_else(|| err("internal: lost operation".into()))?;
                let Some(op) = slot.as_mut() else {
                    return Err(err("internal: lost operation".into()));
                };
                match (kind, f) {
                    (":ok", F::Read) => {
                        let v = if value == "nil" {
                            None
                        } else {
                            Some(int(&value).map_err(err)?)
                        };
                        op.output = RegisterOutput::Read(v);
                        op.ret = Some(n as u64);
                    }
                    (":ok", F::Write) => {
                        let v = int(&value).map_err(err)?;
                        if op.input != RegisterInput::Write(v) {
                            return Err(err(format!(
                                "write of {v} completes a different write (line {})",
                                p.line
                            )));
                        }
                        op.output = RegisterOutput::Write;
                        op.ret = Some(n as u64);
                    }
                    (":ok" | ":fail", F::Cas) => {
                        let (from, to) = pair(&value).map_err(err)?;
                        if op.input != (RegisterInput::Cas { from, to }) {
                            return Err(err(format!(
                                "cas [{from} {to}] completes a different cas (line {})",
                                p.line
                            )));
                        }
                        op.output = RegisterOutput::Cas { ok: kind == ":ok" };
                        op.ret = Some(n as u64);
                    }
                    // A failed or indeterminate read says nothing; a failed write was not applied.
                    (":fail" | ":info", F::Read) | (":fail", F::Write) => *slot = None,
                    // Indeterminate: unknown outcome, return time infinity.
                    _ => {}
                }
            }
            other => {
                return Err(err(format!(
                    "unknown type {other:?} (expected :invoke, :ok, :fail or :info)"
                )));
            }
        }
    }
    if records == 0 {
        return Err(InputError::file(
            file,
            "no Jepsen operation records (`INFO  jepsen.util - PROCESS :TYPE :F VALUE`)",
        ));
    }
    // Reads never completed say nothing; writes and cas never completed stay unknown.
    for p in open.values() {
        if let (F::Read, Some(slot)) = (p.f, ops.get_mut(p.index)) {
            *slot = None;
        }
    }
    Ok(ops.into_iter().flatten().collect())
}

fn excerpt(text: &str) -> String {
    let short: String = text.chars().take(80).collect();
    if short.len() < text.len() {
        format!("{short:?}...")
    } else {
        format!("{short:?}")
    }
}

fn int(s: &str) -> Result<i64, String> {
    s.parse()
        .map_err(|_| format!("expected an integer, found {s:?}"))
}

fn pair(s: &str) -> Result<(i64, i64), String> {
    let inner = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or_else(|| format!("expected [FROM TO], found {s:?}"))?;
    let mut parts = inner.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), None) => Ok((int(a)?, int(b)?)),
        _ => Err(format!("expected [FROM TO], found {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RegisterInput as I;
    use RegisterOutput as O;

    fn parse(text: &str) -> Result<Vec<JepsenOp>, String> {
        parse_jepsen("h.log", text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_porcupine_lines() {
        let ops = parse(
            "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n\
             INFO  jepsen.util - 1\t:invoke\t:cas\t[3 0]\n\
             INFO  jepsen.util - 2\t:invoke\t:write\t4\n\
             INFO  jepsen.util - 0\t:ok\t:read\t3\n\
             INFO  jepsen.util - 1\t:fail\t:cas\t[3 0]\n\
             INFO  jepsen.util - 2\t:info\t:write\t:timed-out\n\
             INFO  jepsen.util - 3\t:invoke\t:read\tnil\n\
             INFO  jepsen.util - 3\t:fail\t:read\t:timed-out\n\
             INFO  jepsen.core - some other logger\n\
             INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n\
             INFO  jepsen.util - 4\t:invoke\t:cas\t[1 2]\n",
        )
        .unwrap();
        let got: Vec<_> = ops
            .iter()
            .map(|o| (o.client, o.call, o.ret, o.input, o.output))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 1, Some(4), I::Read, O::Read(Some(3))),
                (
                    1,
                    2,
                    Some(5),
                    I::Cas { from: 3, to: 0 },
                    O::Cas { ok: false }
                ),
                (2, 3, None, I::Write(4), O::Unknown),
                (4, 11, None, I::Cas { from: 1, to: 2 }, O::Unknown),
            ]
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        assert_eq!(
            parse("garbage\n").unwrap_err(),
            "h.log:1: not a line of a Jepsen log (expected `INFO  jepsen.util - PROCESS :TYPE :F VALUE`): \"garbage\""
        );
        assert_eq!(
            parse("").unwrap_err(),
            "h.log: no Jepsen operation records (`INFO  jepsen.util - PROCESS :TYPE :F VALUE`)"
        );
        let e = parse("INFO jepsen.util - 0 :invoke :write x\n").unwrap_err();
        assert_eq!(e, "h.log:1: expected an integer, found \"x\"");
        let e = parse("INFO jepsen.util - 0 :ok :write 1\n").unwrap_err();
        assert_eq!(
            e,
            "h.log:1: process 0 completes an operation it never invoked"
        );
        let e = parse(
            "INFO jepsen.util - 0 :invoke :write 1\nINFO jepsen.util - 0 :invoke :read nil\n",
        )
        .unwrap_err();
        assert_eq!(
            e,
            "h.log:2: process 0 invokes again while its operation of line 1 is open"
        );
        let e =
            parse("INFO jepsen.util - 0 :invoke :write 1\nINFO jepsen.util - 0 :ok :cas [1 2]\n")
                .unwrap_err();
        assert_eq!(
            e,
            "h.log:2: process 0 completes :cas but invoked :write on line 1"
        );
        let e = parse("INFO jepsen.util - 0 :invoke :cas [1 2 3]\n").unwrap_err();
        assert_eq!(e, "h.log:1: expected [FROM TO], found \"[1 2 3]\"");
        let e = parse("INFO jepsen.util - 0 :invoke :append 1\n").unwrap_err();
        assert_eq!(
            e,
            "h.log:1: unknown function \":append\" (expected :read, :write or :cas)"
        );
    }
}
