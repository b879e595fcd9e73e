use super::*;

/// Feeds `stream` in pieces of `piece` bytes; returns the marked head's number
/// and what was wrong.
fn scan(stream: &[u8], piece: usize) -> Option<(u32, Malformed)> {
    let marks = Arc::new(Marks::default());
    let mut scanner = Scanner::new(8192, marks.clone());
    for bytes in stream.chunks(piece) {
        scanner.feed(bytes);
    }
    (1..=10).find_map(|n| marks.take().map(|what| (n, what)))
}

fn every_split(stream: &[u8]) -> Option<(u32, Malformed)> {
    let whole = scan(stream, stream.len());
    for piece in 1..stream.len() {
        assert_eq!(scan(stream, piece), whole, "pieces of {piece} bytes");
    }
    whole
}

#[test]
fn both_lengths_are_marked_in_either_order() {
    let cl_first = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let te_first = b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n";
    assert_eq!(every_split(cl_first), Some((1, Malformed::BothLengths)));
    assert_eq!(every_split(te_first), Some((1, Malformed::BothLengths)));
}

#[test]
fn bare_lf_is_marked_but_empty_lines_before_a_request_are_not() {
    let bare = b"GET / HTTP/1.1\nHost: a\r\n\r\n";
    let bare_end = b"GET / HTTP/1.1\r\nHost: a\n\n";
    let leading = b"\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_eq!(every_split(bare), Some((1, Malformed::BareLf)));
    assert_eq!(every_split(bare_end), Some((1, Malformed::BareLf)));
    assert_eq!(every_split(leading), None);
}

#[test]
fn bodies_are_skipped_to_find_the_next_head() {
    // The second body holds a head with both lengths: it is data, not a head.
    let mut stream = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello".to_vec();
    let inner = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    stream.extend_from_slice(
        format!(
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n",
            inner.len()
        )
        .as_bytes(),
    );
    stream.extend_from_slice(inner);
    stream.extend_from_slice(b"\r\n0\r\nX-Trailer: 1\r\n\r\n");
    stream.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(every_split(&stream), None);
    stream.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    assert_eq!(every_split(&stream), Some((4, Malformed::BothLengths)));
}

#[test]
fn what_hyper_refuses_or_cannot_be_followed_stops_the_scan() {
    // A chunk size hyper refuses, then a head that would be marked.
    let bad_chunk = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\nGET / HTTP/1.1\nHost: a\r\n\r\n";
    assert_eq!(every_split(bad_chunk), None);
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    assert_eq!(every_split(preface), None);
    let http10_coding =
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n";
    assert_eq!(every_split(http10_coding), None);
}

#[test]
fn a_connect_is_marked_so_that_its_connection_ends_with_its_answer() {
    // What follows a CONNECT is a tunnel's, not requests the scanner could follow:
    // the CONNECT itself is marked (refused, closing), whatever comes after it.
    let connect = b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\nGET / HTTP/1.1\nHost: x\n\n";
    assert_eq!(every_split(connect), Some((1, Malformed::Connect)));
    let later = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nCONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(every_split(later), Some((2, Malformed::Connect)));
    // A method that only starts like it is not a CONNECT.
    assert_eq!(every_split(b"CONNECTX / HTTP/1.1\r\nHost: a\r\n\r\n"), None);
}

proptest::proptest! {
    /// For every head httparse (hyper's parser) accepts, the scanner finds the
    /// same end and the same framing headers.
    #[test]
    fn heads_end_where_httparse_ends_them(
        lines in proptest::collection::vec(proptest::sample::select(vec![
            "Host: a", "content-length: 5", "Content-Length:  12 ", "Content-Length: x",
            "Transfer-Encoding: chunked", "transfer-encoding:gzip, chunked\t",
            "Transfer-Encoding : chunked", "X-A: b\rc", "X-B: \u{e9}", " folded", "X-C:",
            "Content-Lengthy: 3", "", "\r",
        ]), 0..6),
        ends in proptest::collection::vec(proptest::sample::select(vec!["\r\n", "\n", "\r"]), 8),
        lead in proptest::sample::select(vec!["", "\r\n", "\n", "\r\n\r\n"]),
        line in proptest::sample::select(vec!["GET / HTTP/1.1", "POST /x HTTP/1.0", "GET  / HTTP/1.1"]),
    ) {
        let mut head = format!("{lead}{line}{}", ends[0]);
        for (at, header) in lines.iter().enumerate() {
            head.push_str(header);
            head.push_str(ends[at + 1]);
        }
        head.push_str(ends[7]);
        head.push_str("tail");
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let parsed = request.parse(head.as_bytes());
        if let Ok(httparse::Status::Complete(length)) = parsed {
            let (read, ours) = Reading::default()
                .resume(head.as_bytes())
                .expect("a complete head");
            proptest::prop_assert_eq!(ours, length, "{:?}", head);
            let coding = request.headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
            let lengths = request.headers.iter().any(|h| h.name.eq_ignore_ascii_case("content-length"));
            let crlf_only = !head[..length].trim_start_matches(['\r', '\n']).replace("\r\n", "").contains('\n');
            let expected = if coding && lengths {
                Some(Malformed::BothLengths)
            } else if !crlf_only {
                Some(Malformed::BareLf)
            } else {
                None
            };
            if !matches!(read.framing, Framing::Unknown) {
                proptest::prop_assert_eq!(read.malformed, expected, "{:?}", head);
            }
        }
    }
}

proptest::proptest! {
    /// Any bytes, cut anywhere: no panic, and the same verdict however the
    /// reads split them.
    #[test]
    fn any_bytes_in_any_pieces(
        bytes in proptest::collection::vec(proptest::sample::select(b"\r\n :;0aFzGET/HTP1.chunkedContent-LngTrasfr".to_vec()), 0..300),
        piece in 1usize..40,
    ) {
        proptest::prop_assert_eq!(scan(&bytes, piece), scan(&bytes, bytes.len().max(1)));
    }
}

#[test]
fn requests_are_numbered_in_order() {
    let marks = Marks::default();
    marks.mark(2, Malformed::BareLf);
    assert_eq!(marks.take(), None);
    assert_eq!(marks.take(), Some(Malformed::BareLf));
    assert_eq!(marks.take(), None);
}
