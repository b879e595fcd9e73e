use super::*;

/// A client frame: masked with a fixed key, payload masked.
fn client_frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    let key = [1, 2, 3, 4];
    let mut frame = vec![b0];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n < 65536 => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// Feeds `bytes` in pieces of `step`, returning the frames announced, or the first
/// violation.
fn read(frames: &mut Frames, bytes: &[u8], step: usize) -> Result<Vec<Frame>, Violation> {
    let mut seen = Vec::new();
    for piece in bytes.chunks(step) {
        let mut at = 0;
        while at < piece.len() {
            match frames.next(&piece[at..])? {
                Event::Payload(n) => at += n,
                Event::Frame { consumed, frame } => {
                    assert!((2..=14).contains(&frames.header().len()));
                    at += consumed;
                    seen.push(frame);
                }
                Event::Partial => at = piece.len(),
            }
        }
    }
    Ok(seen)
}

fn client() -> Frames {
    Frames::new(Sender::Client, Extensions::None, 0)
}

#[test]
fn a_fragmented_message_starts_once_and_control_frames_pass_between_its_parts() {
    let mut bytes = client_frame(0x01, b"hel");
    bytes.extend(client_frame(0x89, b"ping"));
    bytes.extend(client_frame(0x00, b"lo"));
    bytes.extend(client_frame(0x80, b"!"));
    bytes.extend(client_frame(0x82, &[0; 300]));
    for step in [1, 3, 7, bytes.len()] {
        let seen = read(&mut client(), &bytes, step).unwrap();
        let starts: Vec<bool> = seen.iter().map(|f| f.starts_message).collect();
        assert_eq!(starts, [true, false, false, false, true], "step {step}");
        assert_eq!(seen[1].opcode, Opcode::Ping);
        assert_eq!(seen[4].len, 300);
    }
}

#[test]
fn protocol_breaks_are_1002() {
    let unmasked = [0x81, 0x01, b'x'];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (unmasked.to_vec(), "unmasked client frame"),
        (client_frame(0xC1, b"x"), "reserved bits set"),
        (client_frame(0x83, b"x"), "unknown opcode"),
        (client_frame(0x80, b"x"), "continuation outside a message"),
        (client_frame(0x09, b"x"), "fragmented or long control frame"),
        (
            client_frame(0x89, &[0; 126]),
            "fragmented or long control frame",
        ),
        (client_frame(0x88, b"x"), "close frame of one byte"),
        (
            [client_frame(0x01, b"a"), client_frame(0x81, b"b")].concat(),
            "new message inside a fragmented one",
        ),
    ];
    for (bytes, reason) in cases {
        let violation = read(&mut client(), &bytes, 1).unwrap_err();
        assert_eq!(violation, Violation::protocol(reason));
    }
}

#[test]
fn permessage_deflate_allows_rsv1_on_a_message_first_frame_only() {
    let mut frames = Frames::new(Sender::Client, Extensions::Deflate, 0);
    assert!(read(&mut frames, &client_frame(0xC1, b"x"), 2).is_ok());
    let mut frames = Frames::new(Sender::Client, Extensions::Deflate, 0);
    let continued = [client_frame(0x41, b"x"), client_frame(0xC0, b"y")].concat();
    assert_eq!(
        read(&mut frames, &continued, 2).unwrap_err().reason,
        "reserved bits set"
    );
    let offer = [&b"permessage-deflate; client_max_window_bits"[..]];
    assert_eq!(
        Extensions::negotiated(offer.into_iter()),
        Extensions::Deflate
    );
    let other = [&b"x-custom, permessage-deflate"[..]];
    assert_eq!(
        Extensions::negotiated(other.into_iter()),
        Extensions::Unknown
    );
}

#[test]
fn a_message_over_the_limit_is_1009_whole_or_in_fragments() {
    let mut frames = Frames::new(Sender::Client, Extensions::None, 10);
    assert!(read(&mut frames, &client_frame(0x81, &[0; 10]), 4).is_ok());
    let big = client_frame(0x82, &[0; 11]);
    assert_eq!(read(&mut frames, &big, 4).unwrap_err().code, code::TOO_BIG);
    let mut frames = Frames::new(Sender::Client, Extensions::None, 10);
    let parts = [client_frame(0x01, &[0; 6]), client_frame(0x80, &[0; 5])].concat();
    assert_eq!(
        read(&mut frames, &parts, 3).unwrap_err().code,
        code::TOO_BIG
    );
}

#[test]
fn the_first_close_code_is_read_through_the_mask() {
    let mut frames = client();
    let closes = [
        client_frame(0x88, &[0x03, 0xE8, b'b', b'y', b'e']),
        client_frame(0x88, &[0x03, 0xE9]),
    ]
    .concat();
    read(&mut frames, &closes, 1).unwrap();
    assert_eq!(frames.close_code(), Some(1000));
    let mut server = Frames::new(Sender::Server, Extensions::None, 0);
    read(&mut server, &close_frame(1008, "limited", None), 5).unwrap();
    assert_eq!(server.close_code(), Some(1008));
    assert!(!server.in_payload());
    let mut upstream = client();
    read(&mut upstream, &close_frame(1001, "", Some([9, 8, 7, 6])), 1).unwrap();
    assert_eq!(upstream.close_code(), Some(1001));
}

#[test]
fn a_server_must_not_mask_and_long_lengths_are_read() {
    let mut server = Frames::new(Sender::Server, Extensions::None, 0);
    let masked = client_frame(0x81, b"x");
    assert_eq!(
        read(&mut server, &masked, 1).unwrap_err().reason,
        "masked server frame"
    );
    let mut frames = client();
    let seen = read(&mut frames, &client_frame(0x82, &[7; 70_000]), 999).unwrap();
    assert_eq!(seen[0].len, 70_000);
    assert!(!frames.in_payload());
}
