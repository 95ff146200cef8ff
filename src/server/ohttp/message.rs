//! Binary HTTP (RFC 9292) inside the gateway: the encapsulated request as an `http::Request`,
//! and the router's response as a known-length message or, streamed, as an
//! indeterminate-length one whose content chunks follow the events as they are produced.

use std::io::Cursor;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response};

/// Header fields that describe one hop, not the message: dropped on the way in and out.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| hop.as_bytes().eq_ignore_ascii_case(name))
}

/// A Binary HTTP request as an `http::Request` whose URI is the message's path (the authority
/// and scheme name the gateway itself and are not used). `Err` names what is wrong.
pub fn decode_request(bytes: &[u8]) -> Result<Request<Bytes>, String> {
    let mut cursor = Cursor::new(bytes);
    let message = bhttp::Message::read_bhttp(&mut cursor)
        .map_err(|err| format!("the encapsulated request is not a Binary HTTP message: {err}"))?;
    let control = message.control();
    let (Some(method), Some(path)) = (control.method(), control.path()) else {
        return Err("the Binary HTTP message is a response, not a request".to_owned());
    };
    let method = Method::from_bytes(method)
        .map_err(|_| "the Binary HTTP request's method is not a token".to_owned())?;
    if !path.starts_with(b"/") {
        return Err("the Binary HTTP request's path must start with `/`".to_owned());
    }
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .body(Bytes::copy_from_slice(message.content()))
        .map_err(|_| "the Binary HTTP request's path is not a valid URI path".to_owned())?;
    let headers = request.headers_mut();
    for field in message.header().fields() {
        if hop_by_hop(field.name()) || field.name().eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        let name = HeaderName::from_bytes(field.name())
            .map_err(|_| "a Binary HTTP header field name is invalid".to_owned())?;
        let value = HeaderValue::from_bytes(field.value())
            .map_err(|_| "a Binary HTTP header field value is invalid".to_owned())?;
        headers.append(name, value);
    }
    Ok(request)
}

/// A complete response as a known-length Binary HTTP message.
pub fn encode_response(response: &Response<()>, content: &[u8]) -> Result<Vec<u8>, String> {
    let mut message = response_message(response)?;
    message.write_content(content);
    let mut out = Vec::with_capacity(content.len() + 256);
    message
        .write_bhttp(bhttp::Mode::KnownLength, &mut out)
        .map_err(|err| format!("the response could not be encoded: {err}"))?;
    Ok(out)
}

/// The start of an indeterminate-length Binary HTTP response: framing indicator, status and
/// header fields. [`content_chunk`]s follow, then [`STREAM_END`].
pub fn response_head(response: &Response<()>) -> Result<Vec<u8>, String> {
    let message = response_message(response)?;
    let mut out = Vec::with_capacity(256);
    message
        .write_bhttp(bhttp::Mode::IndeterminateLength, &mut out)
        .map_err(|err| format!("the response could not be encoded: {err}"))?;
    // A message without content ends with the empty chunk that ends the content and the empty
    // trailer section: what remains is the head.
    match out.strip_suffix(STREAM_END) {
        Some(head) => Ok(head.to_vec()),
        None => Err("the Binary HTTP encoder wrote an unexpected ending".to_owned()),
    }
}

/// The end of an indeterminate-length message: the empty chunk that ends the content, then an
/// empty trailer section.
pub const STREAM_END: &[u8] = &[0, 0];

/// One content chunk of an indeterminate-length message (RFC 9292 §3.8): its length as a
/// variable-length integer, then the bytes. `data` must not be empty (an empty chunk ends the
/// content).
pub fn content_chunk(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 8);
    let len = data.len() as u64;
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.extend_from_slice(&((len as u16) | 0x4000).to_be_bytes());
    } else if len < 1 << 30 {
        out.extend_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
    } else {
        out.extend_from_slice(&(len | 0xc000_0000_0000_0000).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn response_message(response: &Response<()>) -> Result<bhttp::Message, String> {
    let status = bhttp::StatusCode::try_from(u64::from(response.status().as_u16()))
        .map_err(|err| format!("status {} cannot be encoded: {err}", response.status()))?;
    let mut message = bhttp::Message::response(status);
    for (name, value) in response.headers() {
        if hop_by_hop(name.as_str().as_bytes()) || name == http::header::CONTENT_LENGTH {
            continue;
        }
        message.put_header(name.as_str(), value.as_bytes());
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9292 §5.1: the example request in known-length form.
    const RFC9292_REQUEST_KNOWN: &str = concat!(
        "0003474554056874747073000a2f68656c6c6f2e747874406c0a757365722d61",
        "67656e74346375726c2f372e31362e33206c69626375726c2f372e31362e3320",
        "4f70656e53534c2f302e392e376c207a6c69622f312e322e3304686f73740f77",
        "77772e6578616d706c652e636f6d0f6163636570742d6c616e67756167650665",
        "6e2c206d690000",
    );

    /// RFC 9292 §5.1: the same request in indeterminate-length form, with padding.
    const RFC9292_REQUEST_INDETERMINATE: &str = concat!(
        "02034745540568747470730",
        "00a2f68656c6c6f2e7478740a757365722d6167656e74346375726c2f372e31",
        "362e33206c69626375726c2f372e31362e33204f70656e53534c2f302e392e37",
        "6c207a6c69622f312e322e3304686f73740f7777772e6578616d706c652e636f",
        "6d0f6163636570742d6c616e677561676506656e2c206d690000000000000000",
        "0000000000",
    );

    /// RFC 9292 §5.2: the example response (indeterminate length, after two interim
    /// responses).
    const RFC9292_RESPONSE: &str = concat!(
        "0340660772756e6e696e670a22736c65657020313522004067046c696e6b233c",
        "2f7374796c652e6373733e3b2072656c3d7072656c6f61643b2061733d737479",
        "6c65046c696e6b243c2f7363726970742e6a733e3b2072656c3d7072656c6f61",
        "643b2061733d7363726970740040c804646174651d4d6f6e2c203237204a756c",
        "20323030392031323a32383a353320474d540673657276657206417061636865",
        "0d6c6173742d6d6f6469666965641d5765642c203232204a756c203230303920",
        "31393a31353a353620474d5404657461671422333461613338372d642d313536",
        "3865623030220d6163636570742d72616e6765730562797465730e636f6e7465",
        "6e742d6c656e67746802353104766172790f4163636570742d456e636f64696e",
        "670c636f6e74656e742d747970650a746578742f706c61696e003348656c6c6f",
        "20576f726c6421204d7920636f6e74656e7420696e636c756465732061207472",
        "61696c696e672043524c462e0d0a0000",
    );

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    fn check_rfc_request(request: &Request<Bytes>) {
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri().path(), "/hello.txt");
        assert_eq!(
            request.headers()["user-agent"],
            "curl/7.16.3 libcurl/7.16.3 OpenSSL/0.9.7l zlib/1.2.3"
        );
        assert_eq!(request.headers()["host"], "www.example.com");
        assert_eq!(request.headers()["accept-language"], "en, mi");
        assert!(request.body().is_empty());
    }

    #[test]
    fn rfc9292_example_requests_decode() {
        check_rfc_request(&decode_request(&unhex(RFC9292_REQUEST_KNOWN)).unwrap());
        check_rfc_request(&decode_request(&unhex(RFC9292_REQUEST_INDETERMINATE)).unwrap());
    }

    #[test]
    fn rfc9292_example_response_decodes() {
        let bytes = unhex(RFC9292_RESPONSE);
        let message = bhttp::Message::read_bhttp(&mut Cursor::new(&bytes[..])).unwrap();
        let interim: Vec<u16> = message
            .informational()
            .iter()
            .map(|info| info.status().code())
            .collect();
        assert_eq!(interim, [102, 103]);
        assert_eq!(message.control().status().map(|s| s.code()), Some(200));
        assert_eq!(message.header().get(b"server"), Some(&b"Apache"[..]));
        assert_eq!(
            message.header().get(b"etag"),
            Some(&b"\"34aa387-d-1568eb00\""[..])
        );
        assert_eq!(
            message.content(),
            b"Hello World! My content includes a trailing CRLF.\r\n"
        );
    }

    #[test]
    fn rfc9292_known_length_request_encodes_to_its_bytes() {
        let mut message = bhttp::Message::request(
            b"GET".to_vec(),
            b"https".to_vec(),
            Vec::new(),
            b"/hello.txt".to_vec(),
        );
        message.put_header(
            "user-agent",
            "curl/7.16.3 libcurl/7.16.3 OpenSSL/0.9.7l zlib/1.2.3",
        );
        message.put_header("host", "www.example.com");
        message.put_header("accept-language", "en, mi");
        let mut out = Vec::new();
        message
            .write_bhttp(bhttp::Mode::KnownLength, &mut out)
            .unwrap();
        assert_eq!(hex::encode(out), RFC9292_REQUEST_KNOWN);
    }

    #[test]
    fn a_response_decodes_as_it_was_encoded_whole_or_streamed() {
        let response = Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .header("inferno-audit-index", "7")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let whole = encode_response(&response, b"data: hi\n\n").unwrap();
        let mut streamed = response_head(&response).unwrap();
        streamed.extend(content_chunk(b"data: h"));
        streamed.extend(content_chunk(&[b'i'; 100]));
        streamed.extend_from_slice(STREAM_END);
        for (bytes, content) in [
            (whole, b"data: hi\n\n".to_vec()),
            (streamed, [b"data: h".as_slice(), &[b'i'; 100]].concat()),
        ] {
            let message = bhttp::Message::read_bhttp(&mut Cursor::new(&bytes[..])).unwrap();
            assert_eq!(message.control().status().map(|s| s.code()), Some(200));
            assert_eq!(
                message.header().get(b"content-type"),
                Some(&b"text/event-stream"[..])
            );
            assert_eq!(
                message.header().get(b"inferno-audit-index"),
                Some(&b"7"[..])
            );
            assert_eq!(message.header().get(b"transfer-encoding"), None);
            assert_eq!(message.content(), &content[..]);
        }
    }

    #[test]
    fn bad_messages_are_refused_with_a_reason() {
        assert!(decode_request(b"").is_err());
        assert!(
            decode_request(&unhex("0140c8"))
                .unwrap_err()
                .contains("response")
        );
        let mut relative = bhttp::Message::request(
            b"GET".to_vec(),
            b"https".to_vec(),
            Vec::new(),
            b"v1/models".to_vec(),
        );
        relative.put_header("date", "x");
        let mut out = Vec::new();
        relative
            .write_bhttp(bhttp::Mode::KnownLength, &mut out)
            .unwrap();
        assert!(decode_request(&out).unwrap_err().contains("path"));
    }
}
