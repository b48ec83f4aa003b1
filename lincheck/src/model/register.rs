//! Jepsen's etcd register (Porcupine's `etcdModel`): one register of integers, `nil` at first,
//! with read, write and compare-and-set.

use crate::search::Model;

/// What an operation on the register asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterInput {
    /// Read the value.
    Read,
    /// Write a value.
    Write(i64),
    /// Set `to` if the value is `from`.
    Cas {
        /// The expected value.
        from: i64,
        /// The value to set.
        to: i64,
    },
}

/// What it was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterOutput {
    /// A read's value (`None`: `nil`, never written).
    Read(Option<i64>),
    /// A write acknowledged.
    Write,
    /// A compare-and-set: `ok` whether the value was `from` (and is now `to`).
    Cas {
        /// Whether it succeeded.
        ok: bool,
    },
    /// No answer (timed out): the operation may have taken effect or not.
    Unknown,
}

/// The register model. Its state is the value, `None` for `nil`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegisterModel;

impl Model for RegisterModel {
    type State = Option<i64>;
    type Input = RegisterInput;
    type Output = RegisterOutput;

    fn init(&self) -> Option<i64> {
        None
    }

    fn step(
        &self,
        state: &Option<i64>,
        input: &RegisterInput,
        output: &RegisterOutput,
    ) -> Option<Option<i64>> {
        match (*input, *output) {
            (RegisterInput::Read, RegisterOutput::Unknown) => Some(*state),
            (RegisterInput::Read, RegisterOutput::Read(v)) => (v == *state).then_some(*state),
            (RegisterInput::Read, _) => None,
            (RegisterInput::Write(v), _) => Some(Some(v)),
            (RegisterInput::Cas { from, to }, output) => {
                let matches = *state == Some(from);
                let answer_fits = match output {
                    RegisterOutput::Cas { ok } => ok == matches,
                    RegisterOutput::Unknown => true,
                    _ => false,
                };
                answer_fits.then_some(if matches { Some(to) } else { *state })
            }
        }
    }

    fn describe_operation(&self, input: &RegisterInput, output: &RegisterOutput) -> String {
        let answer = match output {
            RegisterOutput::Unknown => "unknown".to_string(),
            RegisterOutput::Read(v) => show(*v),
            RegisterOutput::Write => "ok".to_string(),
            RegisterOutput::Cas { ok: true } => "ok".to_string(),
            RegisterOutput::Cas { ok: false } => "fail".to_string(),
        };
        match input {
            RegisterInput::Read => format!("read() -> {answer}"),
            RegisterInput::Write(v) => format!("write({v}) -> {answer}"),
            RegisterInput::Cas { from, to } => format!("cas({from}, {to}) -> {answer}"),
        }
    }

    fn describe_state(&self, state: &Option<i64>) -> String {
        show(*state)
    }
}

fn show(v: Option<i64>) -> String {
    v.map_or_else(|| "nil".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use RegisterInput::*;
    use RegisterOutput as Out;

    #[test]
    fn steps_as_porcupine_etcd_model() {
        let m = RegisterModel;
        assert_eq!(m.step(&None, &Read, &Out::Read(None)), Some(None));
        assert_eq!(m.step(&None, &Read, &Out::Read(Some(0))), None);
        assert_eq!(m.step(&Some(3), &Read, &Out::Unknown), Some(Some(3)));
        assert_eq!(m.step(&None, &Write(4), &Out::Unknown), Some(Some(4)));
        assert_eq!(
            m.step(&Some(3), &Cas { from: 3, to: 0 }, &Out::Cas { ok: true }),
            Some(Some(0))
        );
        assert_eq!(
            m.step(&Some(3), &Cas { from: 3, to: 0 }, &Out::Cas { ok: false }),
            None
        );
        assert_eq!(
            m.step(&Some(2), &Cas { from: 3, to: 0 }, &Out::Cas { ok: false }),
            Some(Some(2))
        );
        assert_eq!(
            m.step(&None, &Cas { from: 0, to: 1 }, &Out::Cas { ok: true }),
            None
        );
        assert_eq!(
            m.step(&Some(2), &Cas { from: 2, to: 1 }, &Out::Unknown),
            Some(Some(1))
        );
        assert_eq!(
            m.step(&Some(2), &Cas { from: 3, to: 1 }, &Out::Unknown),
            Some(Some(2))
        );
        assert_eq!(
            m.describe_operation(&Cas { from: 1, to: 2 }, &Out::Cas { ok: false }),
            "cas(1, 2) -> fail"
        );
        assert_eq!(
            m.describe_operation(&Read, &Out::Read(None)),
            "read() -> nil"
        );
        assert_eq!(m.describe_state(&Some(7)), "7");
    }
}
