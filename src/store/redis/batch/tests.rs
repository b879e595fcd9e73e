use super::*;

fn job(
    caller: &str,
    total: Option<&str>,
    cost: u32,
    limit: u32,
) -> (Job, oneshot::Receiver<Result<Answer, StoreError>>) {
    let mut shape = Shape::new(1, usize::from(total.is_some()), 0);
    shape.quota(1, limit, 1);
    if total.is_some() {
        shape.quota(1, 1_000, 480);
    }
    let (answer_to, answer) = oneshot::channel();
    let job = Job {
        caller: caller.to_string(),
        total: total.map(Arc::from),
        cost,
        refund_at: None,
        charge: false,
        shape: Arc::new(shape),
        answer_to,
        deadline: None,
        stacked: None,
    };
    (job, answer)
}

#[test]
fn a_batch_sends_each_key_and_each_shape_once() {
    let (a, _) = job("caller-a", Some("total"), 1, 10);
    let (b, _) = job("caller-b", Some("total"), 2, 10);
    let (c, _) = job("caller-a", None, 1, 20);
    let batch = [a, b, c];
    let (keys, packed) = encode(&batch, 1_774_000_000_050);
    assert_eq!(keys, ["caller-a", "total", "caller-b"]);
    // Two shapes: (1 plan + 1 total quota) and (1 plan quota, another limit),
    // each after its four counts.
    let shape_ab = 4 + 9 + 9;
    let shape_c = 4 + 9;
    assert_eq!(packed.len(), 12 + shape_ab + shape_c + 3 * 10);
    assert_eq!(packed[..4], [3, 0, 2, 0], "N = 3 requests, S = 2 shapes");
    let deadline = f64::from_le_bytes(packed[4..12].try_into().unwrap());
    assert_eq!(
        deadline, 1_774_000_000_050.0,
        "the deadline in Redis's clock"
    );
    let requests: Vec<(u32, u16, u16, u16)> = packed[12 + shape_ab + shape_c..]
        .chunks_exact(10)
        .map(|r| {
            let u16_at = |i: usize| u16::from_le_bytes([r[i], r[i + 1]]);
            (
                u32::from_le_bytes([r[0], r[1], r[2], r[3]]),
                u16_at(4),
                u16_at(6),
                u16_at(8),
            )
        })
        .collect();
    // (cost, caller key, total key (0 = none), shape), indexes from 1.
    assert_eq!(requests, [(1, 1, 2, 1), (2, 3, 2, 1), (1, 1, 0, 2)]);
}

fn answer(admitted: u8, values: &[f64]) -> Vec<u8> {
    let mut bytes = vec![admitted, (values.len() / 3) as u8];
    for value in values {
        bytes.extend(value.to_le_bytes());
    }
    bytes
}

#[test]
fn a_refund_is_marked_and_carries_its_instant() {
    let (mut refund, _) = job("caller-a", None, 2, 10);
    refund.refund_at = Some(1_774_000_000_123);
    let (_, packed) = encode(&[refund], 0);
    let request = &packed[packed.len() - 18..];
    assert_eq!(
        u32::from_le_bytes(request[..4].try_into().unwrap()),
        REFUND | 2
    );
    let at = f64::from_le_bytes(request[10..].try_into().unwrap());
    assert_eq!(at, 1_774_000_000_123.0);
}

#[tokio::test]
async fn each_job_gets_its_part_of_the_answer_and_a_short_answer_is_an_error() {
    let (a, answer_a) = job("a", None, 1, 10);
    let (b, answer_b) = job("b", Some("total"), 1, 10);
    let (c, answer_c) = job("c", None, 1, 10);
    let mut packed = 1_774_000_000_500f64.to_le_bytes().to_vec();
    packed.extend(answer(1, &[3.0, 1_500.0, -1.0]));
    packed.extend(answer(0, &[10.0, 200.0, 200.0, 0.0, 900.0, -1.0]));
    // Nothing for c: the answer ends early.
    split(&packed, vec![a, b, c]);
    let (late, answer_late) = job("late", None, 1, 10);
    let (after, answer_after) = job("after", None, 1, 10);
    let mut packed = 1_774_000_000_500f64.to_le_bytes().to_vec();
    packed.extend(answer(LATE, &[]));
    packed.extend(answer(1, &[1.0, 60_000.0, -1.0]));
    split(&packed, vec![late, after]);
    assert!(matches!(answer_late.await.unwrap(), Err(StoreError::Late)));
    assert!(
        answer_after.await.unwrap().unwrap().admitted,
        "the next record"
    );
    let at_ms = 1_774_000_000_500;
    assert_eq!(
        answer_a.await.unwrap().unwrap(),
        Answer {
            at_ms,
            admitted: true,
            statuses: vec![[3, 1_500, -1]],
            parts: Vec::new(),
        }
    );
    assert_eq!(
        answer_b.await.unwrap().unwrap(),
        Answer {
            at_ms,
            admitted: false,
            statuses: vec![[10, 200, 200], [0, 900, -1]],
            parts: Vec::new(),
        }
    );
    assert!(answer_c.await.unwrap().is_err());
}
