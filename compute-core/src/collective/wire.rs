//! Framing for the rendezvous sockets: length-prefixed messages read and written against a
//! deadline, and the encodings of the values they carry.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use super::error::{CollectiveError, MismatchKind};
use crate::collective::ReduceOperation;
use crate::elem::ElemType;

/// The largest message accepted (a guard against a corrupt length, not a limit on real data).
const MAX_FRAME: u64 = 1 << 38;

/// Why a socket operation did not complete.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The deadline passed.
    Timeout,
    /// The connection closed or failed.
    Closed(String),
}

fn remaining(deadline: Instant) -> Option<core::time::Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// Fill `buf` from `stream`, giving up at `deadline`.
fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), Failure> {
    let mut filled = 0;
    while filled < buf.len() {
        let Some(left) = remaining(deadline) else {
            return Err(Failure::Timeout);
        };
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| Failure::Closed(e.to_string()))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(Failure::Closed("connection closed".into())),
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::Closed(e.to_string())),
        }
    }
    Ok(())
}

/// Read one message.
pub(crate) fn read_frame(stream: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, Failure> {
    let mut len = [0u8; 8];
    read_exact_by(stream, &mut len, deadline)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(Failure::Closed(format!(
            "a message of {len} bytes (corrupt stream)"
        )));
    }
    let mut body = vec![0u8; len as usize];
    read_exact_by(stream, &mut body, deadline)?;
    Ok(body)
}

/// Write one message.
pub(crate) fn write_frame(
    stream: &mut TcpStream,
    body: &[u8],
    deadline: Instant,
) -> Result<(), Failure> {
    let Some(left) = remaining(deadline) else {
        return Err(Failure::Timeout);
    };
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| Failure::Closed(e.to_string()))?;
    let mut framed = Vec::with_capacity(body.len() + 8);
    framed.extend_from_slice(&(body.len() as u64).to_le_bytes());
    framed.extend_from_slice(body);
    stream.write_all(&framed).map_err(|e| {
        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            Failure::Timeout
        } else {
            Failure::Closed(e.to_string())
        }
    })
}

/// Builds a message.
#[derive(Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn new(tag: u8) -> Self {
        Self(vec![tag])
    }
    pub(crate) fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(self, v: &[u8]) -> Self {
        let mut s = self.u64(v.len() as u64);
        s.0.extend_from_slice(v);
        s
    }
    pub(crate) fn str(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads a message.
pub(crate) struct Reader<'a>(&'a [u8]);

fn short() -> CollectiveError {
    CollectiveError::Protocol("message too short".into())
}

impl<'a> Reader<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Self {
        Self(body)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, CollectiveError> {
        let (&v, rest) = self.0.split_first().ok_or_else(short)?;
        self.0 = rest;
        Ok(v)
    }
    pub(crate) fn u64(&mut self) -> Result<u64, CollectiveError> {
        let (head, rest) = self.0.split_at_checked(8).ok_or_else(short)?;
        self.0 = rest;
        let mut v = [0u8; 8];
        v.copy_from_slice(head);
        Ok(u64::from_le_bytes(v))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CollectiveError> {
        let len = usize::try_from(self.u64()?).map_err(|_| short())?;
        let (head, rest) = self.0.split_at_checked(len).ok_or_else(short)?;
        self.0 = rest;
        Ok(head)
    }
    pub(crate) fn string(&mut self) -> Result<String, CollectiveError> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| CollectiveError::Protocol("a string that is not UTF-8".into()))
    }
    pub(crate) fn usize(&mut self) -> Result<usize, CollectiveError> {
        usize::try_from(self.u64()?)
            .map_err(|_| CollectiveError::Protocol("a count over usize".into()))
    }
}

const ELEMS: [ElemType; 13] = [
    ElemType::Bool,
    ElemType::I8,
    ElemType::I16,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::U16,
    ElemType::U32,
    ElemType::U64,
    ElemType::F16,
    ElemType::BF16,
    ElemType::F32,
    ElemType::F64,
];

pub(crate) fn elem_code(t: ElemType) -> u8 {
    ELEMS.iter().position(|&e| e == t).unwrap_or(usize::MAX) as u8
}

pub(crate) fn elem_from(code: u8) -> Result<ElemType, CollectiveError> {
    ELEMS
        .get(code as usize)
        .copied()
        .ok_or_else(|| CollectiveError::Protocol(format!("unknown element type code {code}")))
}

const OPS: [ReduceOperation; 4] = [
    ReduceOperation::Sum,
    ReduceOperation::Mean,
    ReduceOperation::Max,
    ReduceOperation::Min,
];

pub(crate) fn op_code(op: ReduceOperation) -> u8 {
    OPS.iter().position(|&o| o == op).unwrap_or(usize::MAX) as u8
}

pub(crate) fn op_from(code: u8) -> Result<ReduceOperation, CollectiveError> {
    OPS.get(code as usize)
        .copied()
        .ok_or_else(|| CollectiveError::Protocol(format!("unknown operation code {code}")))
}

const KINDS: [MismatchKind; 4] = [
    MismatchKind::Size,
    MismatchKind::DType,
    MismatchKind::Operation,
    MismatchKind::Round,
];

/// Append `e` to `w`.
pub(crate) fn put_error(w: Writer, e: &CollectiveError) -> Writer {
    use CollectiveError as E;
    match e {
        E::MissingVariable { name, hint } => w.u8(0).str(name).str(hint),
        E::InvalidVariable {
            name,
            value,
            reason,
        } => w.u8(1).str(name).str(value).str(reason),
        E::Timeout {
            waiting_for,
            timeout_ms,
        } => w.u8(2).str(waiting_for).u64(*timeout_ms),
        E::PeerLost { rank, reason } => w.u8(3).u64(*rank as u64).str(reason),
        E::Mismatch {
            round,
            kind,
            expected,
            found,
            participant,
        } => w
            .u8(4)
            .u64(*round)
            .u8(KINDS.iter().position(|k| k == kind).unwrap_or(0) as u8)
            .str(expected)
            .str(found)
            .str(participant),
        E::WorldSize {
            rank,
            expected,
            found,
        } => w
            .u8(5)
            .u64(*rank as u64)
            .u64(*expected as u64)
            .u64(*found as u64),
        E::DuplicateRank { rank } => w.u8(6).u64(*rank as u64),
        E::Io { what, reason } => w.u8(7).str(what).str(reason),
        E::Protocol(m) => w.u8(8).str(m),
        E::AlreadyJoined(m) => w.u8(9).str(m),
        // Argument errors of a local call are never sent between ranks as such; should one be,
        // its text travels.
        E::NotInGroup { .. }
        | E::UnknownDevice { .. }
        | E::NotInitialised { .. }
        | E::NoContribution
        | E::ContributionSizes { .. }
        | E::Sizes { .. } => w.u8(8).str(&e.to_string()),
    }
}

/// Read an error written by [`put_error`].
pub(crate) fn get_error(r: &mut Reader<'_>) -> Result<CollectiveError, CollectiveError> {
    use CollectiveError as E;
    Ok(match r.u8()? {
        0 => E::MissingVariable {
            name: r.string()?,
            hint: r.string()?,
        },
        1 => E::InvalidVariable {
            name: r.string()?,
            value: r.string()?,
            reason: r.string()?,
        },
        2 => E::Timeout {
            waiting_for: r.string()?,
            timeout_ms: r.u64()?,
        },
        3 => E::PeerLost {
            rank: r.usize()?,
            reason: r.string()?,
        },
        4 => E::Mismatch {
            round: r.u64()?,
            kind: *KINDS
                .get(r.u8()? as usize)
                .ok_or_else(|| E::Protocol("unknown mismatch kind".into()))?,
            expected: r.string()?,
            found: r.string()?,
            participant: r.string()?,
        },
        5 => E::WorldSize {
            rank: r.usize()?,
            expected: r.usize()?,
            found: r.usize()?,
        },
        6 => E::DuplicateRank { rank: r.usize()? },
        7 => E::Io {
            what: r.string()?,
            reason: r.string()?,
        },
        8 => E::Protocol(r.string()?),
        9 => E::AlreadyJoined(r.string()?),
        other => return Err(E::Protocol(format!("unknown error code {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip() {
        let all = [
            CollectiveError::MissingVariable {
                name: "RANK".into(),
                hint: "h".into(),
            },
            CollectiveError::Timeout {
                waiting_for: "rank 3".into(),
                timeout_ms: 250,
            },
            CollectiveError::PeerLost {
                rank: 2,
                reason: "closed".into(),
            },
            CollectiveError::Mismatch {
                round: 7,
                kind: MismatchKind::Operation,
                expected: "Sum".into(),
                found: "Max".into(),
                participant: "rank 1".into(),
            },
            CollectiveError::WorldSize {
                rank: 1,
                expected: 2,
                found: 3,
            },
            CollectiveError::DuplicateRank { rank: 4 },
        ];
        for e in all {
            let body = put_error(Writer::new(9), &e).0;
            let mut r = Reader::new(&body);
            assert_eq!(r.u8().unwrap(), 9);
            assert_eq!(get_error(&mut r).unwrap(), e);
        }
        for t in ELEMS {
            assert_eq!(elem_from(elem_code(t)).unwrap(), t);
        }
        for o in OPS {
            assert_eq!(op_from(op_code(o)).unwrap(), o);
        }
        assert!(elem_from(200).is_err());
        assert!(Reader::new(&[1, 2]).u64().is_err());
    }
}
