//! The long connection's frame: `pbbp2.Frame`, a protobuf (proto2) message, one per binary
//! WebSocket message, as the official SDKs define it (oapi-sdk-go `ws/pbbp2.pb.go`,
//! oapi-sdk-python `lark_oapi/ws/pb/pbbp2_pb2.py`):
//!
//! ```text
//! message Header { required string key = 1; required string value = 2; }
//! message Frame {
//!   required uint64 SeqID = 1;  required uint64 LogID = 2;
//!   required int32 service = 3; required int32 method = 4;
//!   repeated Header headers = 5;
//!   optional string payload_encoding = 6; optional string payload_type = 7;
//!   optional bytes payload = 8;           optional string LogIDNew = 9;
//! }
//! ```
//!
//! `method` 0 is a control frame (`type` header `ping` or `pong`), 1 a data frame (`type`
//! `event` or `card`). The optional fields are kept as received, so an answer (the frame sent
//! back with a new payload) carries everything the server put in it.

use prost::Message;

/// `method` of a control frame (ping, pong).
pub(crate) const CONTROL: i32 = 0;
/// `method` of a data frame (an event or a card action).
pub(crate) const DATA: i32 = 1;

/// The header naming what a frame holds: `ping`, `pong`, `event`, `card`.
pub(crate) const TYPE: &str = "type";
/// The header with the message's id; every part of a split payload has the same one.
pub(crate) const MESSAGE_ID: &str = "message_id";
/// The header with the number of parts of a split payload (1, or absent, when whole).
pub(crate) const SUM: &str = "sum";
/// The header with a part's index, from 0.
pub(crate) const SEQ: &str = "seq";
/// The header with the delivery's trace id (for the logs).
pub(crate) const TRACE_ID: &str = "trace_id";
/// The header an answer adds: how long the event took to handle, in milliseconds.
pub(crate) const BIZ_RT: &str = "biz_rt";

/// One header of a frame.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Header {
    #[prost(string, required, tag = "1")]
    pub(crate) key: String,
    #[prost(string, required, tag = "2")]
    pub(crate) value: String,
}

/// One frame of the long connection.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Frame {
    #[prost(uint64, required, tag = "1")]
    pub(crate) seq_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub(crate) log_id: u64,
    #[prost(int32, required, tag = "3")]
    pub(crate) service: i32,
    #[prost(int32, required, tag = "4")]
    pub(crate) method: i32,
    #[prost(message, repeated, tag = "5")]
    pub(crate) headers: Vec<Header>,
    #[prost(string, optional, tag = "6")]
    pub(crate) payload_encoding: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub(crate) payload_type: Option<String>,
    #[prost(bytes = "vec", optional, tag = "8")]
    pub(crate) payload: Option<Vec<u8>>,
    #[prost(string, optional, tag = "9")]
    pub(crate) log_id_new: Option<String>,
}

impl Frame {
    /// The ping the client sends every `PingInterval`: a control frame for the connection's
    /// service with the header `type: ping` and nothing else.
    pub(crate) fn ping(service: i32) -> Self {
        Self {
            service,
            method: CONTROL,
            headers: vec![header(TYPE, "ping")],
            ..Self::default()
        }
    }

    /// The value of the first header named `key`.
    pub(crate) fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    /// The value of header `key` as a number (absent or unreadable: `None`).
    pub(crate) fn header_number(&self, key: &str) -> Option<usize> {
        self.header(key).and_then(|v| v.parse().ok())
    }

    /// The answer to this data frame, as the SDKs write it: the same frame, with a `biz_rt`
    /// header (the milliseconds the event took) and the payload
    /// `{"code": <HTTP status>, "headers": null, "data": <data>}` (Go's `ws.Response`, whose
    /// `Data []byte` JSON holds in base64; the Python SDK writes `base64(JSON(result))`
    /// alike). `data` is a handler's result, such as a card callback's toast and card; `null`
    /// when there is none.
    pub(crate) fn answer(mut self, code: u16, took_ms: u64, data: Option<&[u8]>) -> Self {
        use base64::Engine as _;
        self.headers.push(header(BIZ_RT, &took_ms.to_string()));
        let data = data.map(|data| base64::engine::general_purpose::STANDARD.encode(data));
        self.payload = Some(
            serde_json::json!({"code": code, "headers": null, "data": data})
                .to_string()
                .into_bytes(),
        );
        self
    }
}

/// A header.
pub(crate) fn header(key: &str, value: &str) -> Header {
    Header {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ping for service 7, byte by byte: each required field (tag, value), then the header
    /// `type: ping` as a nested message; no optional field.
    const PING: [u8; 22] = [
        0x08, 0x00, // SeqID = 0
        0x10, 0x00, // LogID = 0
        0x18, 0x07, // service = 7
        0x20, 0x00, // method = 0 (control)
        0x2a, 0x0c, // headers, 12 bytes:
        0x0a, 0x04, b't', b'y', b'p', b'e', // key = "type"
        0x12, 0x04, b'p', b'i', b'n', b'g', // value = "ping"
    ];

    #[test]
    fn a_ping_encodes_to_its_fixed_bytes_and_back() {
        assert_eq!(Frame::ping(7).encode_to_vec(), PING);
        assert_eq!(Frame::decode(&PING[..]).unwrap(), Frame::ping(7));
    }

    /// A data frame as the Go SDK's generated code writes it (every string field, even
    /// empty): SeqID 1, LogID 2, service 3, method 1, headers `type: event` and `sum: 1`,
    /// payload_encoding "", payload_type "", payload `{}`, LogIDNew "x".
    const DATA_FRAME: [u8; 44] = [
        0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x01, // SeqID, LogID, service, method
        0x2a, 0x0d, 0x0a, 0x04, b't', b'y', b'p', b'e', 0x12, 0x05, b'e', b'v', b'e', b'n',
        b't', // type: event
        0x2a, 0x08, 0x0a, 0x03, b's', b'u', b'm', 0x12, 0x01, b'1', // sum: 1
        0x32, 0x00, // payload_encoding ""
        0x3a, 0x00, // payload_type ""
        0x42, 0x02, b'{', b'}', // payload
        0x4a, 0x01, b'x', // LogIDNew "x"
    ];

    #[test]
    fn a_data_frame_decodes_and_encodes_to_the_same_bytes() {
        let frame = Frame::decode(&DATA_FRAME[..]).unwrap();
        assert_eq!((frame.seq_id, frame.log_id), (1, 2));
        assert_eq!((frame.service, frame.method), (3, DATA));
        assert_eq!(frame.header(TYPE), Some("event"));
        assert_eq!(frame.header_number(SUM), Some(1));
        assert_eq!(frame.header(SEQ), None);
        assert_eq!(frame.payload.as_deref(), Some(&b"{}"[..]));
        assert_eq!(frame.payload_encoding.as_deref(), Some(""));
        assert_eq!(frame.log_id_new.as_deref(), Some("x"));
        // Kept as received: the answer carries the server's fields back unchanged.
        assert_eq!(frame.encode_to_vec(), DATA_FRAME);
    }

    #[test]
    fn an_answer_is_the_frame_with_biz_rt_and_the_status() {
        let answer = Frame::decode(&DATA_FRAME[..])
            .unwrap()
            .answer(200, 12, None);
        assert_eq!(answer.seq_id, 1);
        assert_eq!(answer.header(TYPE), Some("event"));
        assert_eq!(answer.header(BIZ_RT), Some("12"));
        let payload: serde_json::Value =
            serde_json::from_slice(answer.payload.as_deref().unwrap()).unwrap();
        assert_eq!(
            payload,
            serde_json::json!({"code": 200, "headers": null, "data": null})
        );
    }

    #[test]
    fn an_answer_with_data_carries_it_in_base64_as_go_marshals_bytes() {
        use base64::Engine as _;
        let result = br#"{"toast":{"type":"success","content":"ok"}}"#;
        let answer = Frame::decode(&DATA_FRAME[..])
            .unwrap()
            .answer(200, 3, Some(result));
        let payload: serde_json::Value =
            serde_json::from_slice(answer.payload.as_deref().unwrap()).unwrap();
        assert_eq!(payload["code"], 200);
        let data = base64::engine::general_purpose::STANDARD
            .decode(payload["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, result);
    }
}
