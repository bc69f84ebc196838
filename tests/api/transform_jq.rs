//! The reference check of transformations (SPEC section 13): for a corpus of programs and
//! bodies, what the product delivers (the worker process's output, through the node's pool)
//! equals what Debian's `jq` prints for the same program and body, or the difference is one of
//! the documented ones (docs/guides/subscriptions.md, "Known differences from jq"), asserted
//! as documented.

use std::io::Write;
use std::process::{Command, Stdio};

use webhook_inbox::transform::{Pool, Ran, Transform};

use crate::requires;

const ORDER: &str = r#"{"id":"evt_1","type":"invoice.paid","data":{"amount":1250,"currency":"eur","customer":{"id":"cus_9","name":"Zoë Ünal","tags":["vip","eu"]},"lines":[{"sku":"a","qty":2,"price":300},{"sku":"b","qty":1,"price":650}]}}"#;
const NUMBERS: &str =
    r#"{"int":42,"neg":-7,"float":2.5,"one":1.0,"exp":1e3,"big":12345678901234567890,"small":0.1}"#;
const TEXT: &str = r#"{"s":"héllo wörld ✓","b64":"aGVsbG8=","n":"42","emoji":"😀","empty":""}"#;

/// Program and body: each is run by both.
const CORPUS: &[(&str, &str)] = &[
    (".id", ORDER),
    ("{id, type}", ORDER),
    ("{event: .id, amount: .data.amount}", ORDER),
    (".data.customer.name", ORDER),
    (".data.lines | map(.qty * .price)", ORDER),
    (".data.lines | map(select(.qty > 1)) | length", ORDER),
    ("[.data.lines[] | .sku]", ORDER),
    (
        "\"\\(.id) paid \\(.data.amount) \\(.data.currency)\"",
        ORDER,
    ),
    (".data.missing", ORDER),
    // Templates (fields only, run without jaq's interpreter): nesting, arrays, interpolation.
    (
        "{\"the id\": .id, c: {n: .data.customer.name, tags: .data.customer.tags}, x: .no.such}",
        ORDER,
    ),
    ("[.id, .data.customer.id, [], {}, .data.currency]", ORDER),
    ("\"\\(.id) for \\(.data.customer.name)\\t✓\"", ORDER),
    ("{s, emoji, label: \"\\(.s)/\\(.empty)\"}", TEXT),
    (".data.missing.deeper", ORDER),
    (".data.discount // 0", ORDER),
    (".data.currency // \"usd\"", ORDER),
    (".data.amount / 100", ORDER),
    (".data.amount % 7", ORDER),
    (
        "reduce .data.lines[] as $l (0; . + $l.qty * $l.price)",
        ORDER,
    ),
    (
        "if .data.amount > 1000 then \"big\" else \"small\" end",
        ORDER,
    ),
    (".data | to_entries | map(.key)", ORDER),
    (".data.customer | keys", ORDER),
    (".data | with_entries(select(.key != \"lines\"))", ORDER),
    (
        "{customer: .data.customer.id, tags: (.data.customer.tags | join(\",\"))}",
        ORDER,
    ),
    (".data.customer.tags | length", ORDER),
    ("select(.type == \"invoice.paid\") | {id}", ORDER),
    ("select(.type == \"charge.refunded\") | {id}", ORDER),
    (".data.amount | tostring", ORDER),
    (".data.lines | sort_by(-.price) | .[0].sku", ORDER),
    ("del(.data.lines) | .data", ORDER),
    (".data.customer.name | ascii_downcase", ORDER),
    (".data.customer.name | test(\"ü\"; \"i\")", ORDER),
    (".s | test(\"w.rld\")", TEXT),
    (".s | length", TEXT),
    (".s | @base64", TEXT),
    (".b64 | @base64d", TEXT),
    (".n | tonumber", TEXT),
    (".emoji + .s", TEXT),
    ("{e: .empty, u: (.s | ascii_upcase)}", TEXT),
    (".s | split(\" \")", TEXT),
    (".int + .neg", NUMBERS),
    (".float * 2", NUMBERS),
    (".int / 2", NUMBERS),
    (".small + 0.2", NUMBERS),
    (".one", NUMBERS),
    (".exp", NUMBERS),
    (".big", NUMBERS),
    (".", NUMBERS),
    ("[.int, .float] | add", NUMBERS),
    (".int | tostring", NUMBERS),
    ("keys", NUMBERS),
    ("to_entries | length", NUMBERS),
    (".[]", ORDER),
    (".data.amount + \"x\"", ORDER),
    ("error(\"no\")", ORDER),
    ("empty", ORDER),
];

/// What a run gave, in one form for both.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    One(String),
    Nothing,
    Several,
    Error,
}

fn product(pool: &Pool, rt: &tokio::runtime::Runtime, program: &str, body: &str) -> Out {
    let transform = Transform::parse(program).unwrap_or_else(|e| panic!("{program}: {e}"));
    match rt.block_on(pool.run(&transform, body.as_bytes())) {
        Ran::One(json) => Out::One(String::from_utf8(json).unwrap()),
        Ran::Nothing => Out::Nothing,
        Ran::Failed(m) if m.contains("more than one output") => Out::Several,
        Ran::Failed(_) => Out::Error,
    }
}

fn jq(program: &str, body: &str) -> Out {
    let mut child = Command::new("jq")
        .args(["-c", program])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("jq runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Out::Error;
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    match lines.as_slice() {
        [] => Out::Nothing,
        [one] => Out::One(one.to_string()),
        _ => Out::Several,
    }
}

#[test]
fn the_product_delivers_what_jq_prints_or_a_documented_difference() {
    if !requires::available("jq", requires::command("jq")) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pool = Pool::new(env!("CARGO_BIN_EXE_webhook-inbox").into());
    let mut same = 0;
    for (program, body) in CORPUS {
        let ours = product(&pool, &rt, program, body);
        let theirs = jq(program, body);
        match KNOWN.iter().find(|(p, _, _)| p == program) {
            None => {
                assert_eq!(ours, theirs, "`{program}` on {body}");
                same += 1;
            }
            Some((_, documented_ours, documented_jq)) => {
                assert_eq!(
                    ours,
                    Out::One(documented_ours.to_string()),
                    "ours: `{program}`"
                );
                assert_eq!(
                    theirs,
                    Out::One(documented_jq.to_string()),
                    "jq: `{program}`"
                );
            }
        }
    }
    assert_eq!(same, CORPUS.len() - KNOWN.len());
    assert!(same >= 30, "the corpus compares {same} programs alike");
}

/// The documented differences (docs/guides/subscriptions.md, "Known differences from jq"):
/// program, what the product delivers, what Debian's jq (1.6) prints.
const KNOWN: &[(&str, &str, &str)] = &[
    // A number is printed as its literal when the program left it unchanged (jq 1.6 prints
    // every number as a double); the values are equal as doubles.
    (".one", "1.0", "1"),
    (".exp", "1e3", "1000"),
    // A big integer keeps every digit; jq rounds it to a double.
    (".big", "12345678901234567890", "12345678901234567000"),
    (
        ".",
        r#"{"int":42,"neg":-7,"float":2.5,"one":1.0,"exp":1e3,"big":12345678901234567890,"small":0.1}"#,
        r#"{"int":42,"neg":-7,"float":2.5,"one":1,"exp":1000,"big":12345678901234567000,"small":0.1}"#,
    ),
    // Arithmetic on a float, or a division, gives a float, printed with its `.0`.
    (".float * 2", "5.0", "5"),
    (".int / 2", "21.0", "21"),
    // The `i` flag folds ASCII letters only.
    (".data.customer.name | test(\"ü\"; \"i\")", "false", "true"),
];
