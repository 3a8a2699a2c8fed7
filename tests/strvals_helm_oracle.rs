//! `sequenced::chart::strvals` against the real helm: every case is rendered with
//! `helm template` and the values helm ends up with (or its error) must be what our parser
//! produces. This is what guarantees `sequenced template --set …` enables the same subcharts
//! as `helm template --set …`.

use sequenced_testkit as support;

use std::path::Path;
use std::process::Command;

use sequenced::chart::strvals::{self, Error};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy)]
enum Flag {
    Json,
    Set,
    Str,
    Literal,
}
use Flag::{Json, Literal, Set, Str};

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Json => "--set-json",
            Set => "--set",
            Str => "--set-string",
            Literal => "--set-literal",
        }
    }

    fn parse(self, input: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
        match self {
            Json => strvals::parse_set_json(input, dest),
            Set => strvals::parse_set(input, dest),
            Str => strvals::parse_set_string(input, dest),
            Literal => strvals::parse_set_literal(input, dest),
        }
    }
}

/// Each case is a command line's value flags. Within a case they are listed in the order helm
/// applies them (all --set-json, then --set, --set-string, --set-literal), which is also the
/// order we apply them in.
const CASES: &[&[(Flag, &str)]] = &[
    // Scalars and typing.
    &[(Set, "name1=value1,name2=value2,")],
    &[(
        Set,
        "a=true,b=FALSE,c=Null,d=0,e=-12,f=+7,g=007,h=1.5,i=1e3,j=0x1f",
    )],
    &[(
        Set,
        "big=9223372036854775807,bigger=9223372036854775808,neg=-9223372036854775808",
    )],
    &[(Set, "a=,b=one two three,c= padded ")],
    &[(Str, "a=true,b=1,c=null,d=0,e=")],
    &[(Set, "a=falſe")],
    // Escapes.
    &[(Set, r"name1=one\,two,name2=three\=four")],
    &[(Set, r"a\.b=c,d\[0]=e,f=g\\h,i=j\")],
    &[(Set, r"a=\{x,y},b={x\,y,z\}}")],
    // Nested maps.
    &[(Set, "outer.inner1=value,outer.middle.inner=value")],
    &[(Set, "bar.enabled=true,tags.front=false,global.x=1")],
    &[(Set, "a.b.c=1,a.b=2")],
    &[(Set, "a.b=2,a.b.c=1")],
    &[(
        Set,
        "n1.n2.n3.n4.n5.n6.n7.n8.n9.n10.n11.n12.n13.n14.n15.n16.n17.n18.n19.n20.n21.n22.n23.n24.n25.n26.n27.n28.n29.n30.n31=x",
    )],
    &[(
        Set,
        "n1.n2.n3.n4.n5.n6.n7.n8.n9.n10.n11.n12.n13.n14.n15.n16.n17.n18.n19.n20.n21.n22.n23.n24.n25.n26.n27.n28.n29.n30.n31.n32=x",
    )],
    // List values.
    &[(Set, "name1={value1,value2},name2={1021,902}")],
    &[(Set, "a={},b={,},c={x,,y},d={x}")],
    &[(Set, "a={x}y")],
    &[(Set, "a={x}.b=1")],
    &[(Set, "a={x,y")],
    &[(Str, "a={1,true,null}")],
    // List indexes.
    &[(Set, "list[0]=foo,list[3]=bar")],
    &[(Set, "list[0].foo=bar,list[0].hello=world")],
    &[(Set, "name1.name2[1].foo=bar,name1.name2[0].foo=bar")],
    &[(Set, "nested[1][1]=1,nested[0][2][1]=x")],
    &[(Set, "a[0][0].b=1,a[0][1][0]=2")],
    &[(Set, "a[+1]=x,b[01]=y")],
    &[(Set, "a[0]=x,a[0]=y")],
    &[(Set, "a[65536]=x,a[0]=y")],
    &[(Set, "a[65537]=x")],
    &[(Set, "a[-1]=x")],
    &[(Set, "list[0].foo=bar,list[-30].hello=world")],
    &[(Set, "a[x]=1")],
    &[(Set, "a[]=1")],
    &[(Set, "a[99999999999999999999]=1")],
    &[(Set, "illegal[0]name.foo=bar")],
    &[(Set, "a[0]'x\"é")],
    &[(Set, "a[0]={x,y},b[1]=")],
    // Input that ends early, which helm accepts.
    &[(Set, "noval[0]")],
    &[(Set, "x=1,a[0")],
    &[(Set, "a[0][1")],
    &[(Set, "a[1].")],
    &[(Set, "a.b.")],
    &[(Set, "x=1,\\")],
    &[(Set, "a[70000]")],
    // Names without values.
    &[(Set, "name1,name2=value2")],
    &[(Set, "name1.name2")],
    &[(Set, "name1=value1,,,,name2=value2,")],
    &[(Set, "name1.=name2")],
    &[(Set, "a\\")],
    &[(Set, "a\tb\u{1}é\u{a0}")],
    &[(Set, "=x,.a=1,[0]=1")],
    &[(Set, "]={}].")],
    // Merging into earlier values.
    &[(Set, "a.b=1,a.c=2"), (Set, "a.b=3,a.d.e=4")],
    &[(Set, "l[0]=x,l[1].y=2"), (Set, "l[3]=z,l[1].w=3")],
    &[
        (Set, "listOuter[0][0].type=listValue"),
        (Set, "listOuter[1][0].status=alive"),
    ],
    &[(Set, "a.b=1"), (Set, "a=null")],
    &[(Set, "a=null"), (Set, "a.b=1")],
    &[(Set, "a=1"), (Set, "a[0]=1")],
    &[(Set, "a[0]=1"), (Set, "a.b=1")],
    &[(Set, "a[0]=1"), (Set, "a[0].b=2")],
    &[(Set, "a[0]=1"), (Set, "a[0][0]=2")],
    &[(Set, "a[0].b=1"), (Set, "a[0]")],
    &[(Set, "a[0]=1,a[1]=2"), (Set, "a[0].")],
    &[(Set, "m.x=1"), (Set, "m.=1")],
    &[(Set, "a=1"), (Str, "a=2,b.c=true")],
    // --set-json.
    &[(Json, r#"a=1,b="s",c=[1,2.5,1e2],d={"x":null},e=,f=true"#)],
    &[(Json, r#"a=1 b=2,c= "x" ,d=  "#)],
    &[(Json, "a=truex=1,b=01")],
    &[(Json, r#"a[2]={"x":1},a[0]=[1]"#)],
    &[
        (Json, r#"{"a":{"b":1}}"#),
        (Json, r#" {"a":{"c":[2]},"d":null} "#),
    ],
    &[(Json, r#"a={"b":1}"#), (Set, "a.c=2,a.d[1]=3")],
    &[(Json, r#"a="\ud800x\ud83d\ude00""#)],
    &[(Json, "a=9007199254740993,b=-0,c=1e21")],
    &[(Json, "a=1x")],
    &[(Json, "a=[1,2")],
    &[(Json, "a=nul")],
    &[(Json, r#"{"a":1}x"#)],
    &[(Json, "a")],
    // --set-literal.
    &[(Literal, r"a.b=c,d=e\,f{g}")],
    &[(Literal, "list[1]=x,y")],
    &[(Literal, "a")],
    &[(Literal, "name1.=name2")],
    &[(Literal, "a=true")],
    // All flags together.
    &[
        (Json, r#"j={"k":[1]}"#),
        (Set, "s=1,j.k[1]=2"),
        (Str, "t=1"),
        (Literal, "l=1,2"),
    ],
];

/// A chart whose only template prints the merged values as JSON.
fn oracle_chart() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let chart = dir.path();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: o\nversion: 0.1.0\n",
    )
    .expect("write Chart.yaml");
    std::fs::create_dir(chart.join("templates")).expect("templates dir");
    std::fs::write(
        chart.join("templates/values.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: o\ndata:\n  values: |-\n    {{ toJson .Values }}\n",
    )
    .expect("write template");
    dir
}

/// The values helm renders for these flags, or its error message.
fn helm_values(chart: &Path, flags: &[(Flag, &str)]) -> Result<Value, String> {
    let helm = support::helm();
    let mut command = Command::new(&helm);
    command.arg("template").arg("o").arg(chart);
    for (flag, input) in flags {
        command.arg(flag.name()).arg(input);
    }
    let output = command.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} ({e}); install it with scripts/install-helm.sh or set SEQUENCED_HELM",
            helm.display()
        )
    });
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = stdout
        .lines()
        .skip_while(|line| line.trim() != "values: |-")
        .nth(1)
        .unwrap_or_else(|| panic!("no values in helm output:\n{stdout}"));
    Ok(serde_json::from_str(json.trim()).expect("helm printed JSON"))
}

/// Our values for the same flags.
fn our_values(flags: &[(Flag, &str)]) -> Result<Value, (Flag, Error)> {
    let mut dest = Map::new();
    for &(flag, input) in flags {
        flag.parse(input, &mut dest).map_err(|e| (flag, e))?;
    }
    Ok(Value::Object(dest))
}

/// JSON equality with numbers compared by value: helm's `toJson` prints an integral float64
/// as `1`, and sequenced keeps such numbers as integers.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn set_flags_merge_values_exactly_as_helm_does() {
    let chart = oracle_chart();
    let mut mismatches = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for flags in CASES {
        let helm = helm_values(chart.path(), flags);
        let ours = our_values(flags);
        let agree = match (&helm, &ours) {
            (Ok(theirs), Ok(ours)) => {
                accepted += 1;
                same(theirs, ours)
            }
            (Err(message), Err((flag, error))) => {
                rejected += 1;
                match flag {
                    // helm does not say why a --set-json value is bad.
                    Json => true,
                    _ => {
                        let prefix = format!("Error: failed parsing {} data: ", flag.name());
                        message.strip_prefix(&prefix) == Some(error.to_string().as_str())
                    }
                }
            }
            _ => false,
        };
        if !agree {
            mismatches.push(format!("{flags:?}\n  helm: {helm:?}\n  ours: {ours:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ from helm:\n{}",
        mismatches.len(),
        CASES.len(),
        mismatches.join("\n")
    );
    // Both outcomes must actually be exercised.
    assert!(
        accepted > 40 && rejected > 20,
        "{accepted} accepted, {rejected} rejected"
    );
}
