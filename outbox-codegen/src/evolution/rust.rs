//! The rust level: the types typify generates for the released schema against the types it
//! generates for the current one, so the rules are what the generated code actually does (an
//! integer with `minimum: 1` is `NonZeroU64`, one with `minimum: 0` is `u64`, a property
//! outside `required` is an `Option`, a property with a `default` is not, a string with a
//! `pattern` is a newtype, a title names the struct and the inline types below it).
//!
//! Both sides are read from typify's type space through its inspection API ([`TypeSpace::iter_types`]
//! and [`typify::Type::details`]), without printing any code. Reading code is what is
//! protected: a renamed or removed type, a removed field, a field of another type, a removed
//! enum variant, and an added one (an exhaustive `match` stops compiling). A field added to a
//! struct is not reported: code that reads the event still compiles, and the producer's own
//! struct literals are compile errors in the producer, as ever.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;
use typify::{TypeDetails, TypeEnumVariant, TypeId, TypeSpace};

use super::rules::Rule;
use super::{Breaks, Change};

/// A Rust type as a struct field, a variant or a newtype holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ty {
    /// A generated type, by name.
    Named(String),
    /// A type from `std` or a dependency (`i64`, `::uuid::Uuid`, `::serde_json::Value`, ...).
    Builtin(String),
    String,
    Unit,
    Option(Box<Ty>),
    Vec(Box<Ty>),
    Set(Box<Ty>),
    Box(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Tuple(Vec<Ty>),
    Array(Box<Ty>, usize),
}

/// A generated type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Def {
    Struct(Vec<(String, Ty)>),
    Enum(Vec<(String, Shape)>),
    Newtype(Ty),
}

/// What an enum variant holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    Unit,
    Tuple(Vec<Ty>),
    Struct(Vec<(String, Ty)>),
}

/// Every generated type of a type space, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct RustTypes {
    defs: BTreeMap<String, Def>,
    /// The names by their letters and digits in lowercase (see [`squash`]), to find the type
    /// of a definition (`$defs/money_amount` is `MoneyAmount`).
    squashed: HashMap<String, Vec<String>>,
}

/// The letters and digits of a name, lowercase: `money_amount`, `MoneyAmount` and
/// `moneyAmount` are all `moneyamount`.
fn squash(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl RustTypes {
    /// Reads the named types (structs, enums, newtypes) of `space`.
    pub(crate) fn of(space: &TypeSpace) -> Self {
        let mut defs = BTreeMap::new();
        for t in space.iter_types() {
            let def = match t.details() {
                TypeDetails::Struct(s) => Def::Struct(
                    s.properties()
                        .map(|(name, id)| (name.to_owned(), ty(space, &id)))
                        .collect(),
                ),
                TypeDetails::Enum(e) => Def::Enum(
                    e.variants()
                        .map(|(name, variant)| {
                            let shape = match variant {
                                TypeEnumVariant::Simple => Shape::Unit,
                                TypeEnumVariant::Tuple(ids) => {
                                    Shape::Tuple(ids.iter().map(|id| ty(space, id)).collect())
                                }
                                TypeEnumVariant::Struct(fields) => Shape::Struct(
                                    fields
                                        .iter()
                                        .map(|(name, id)| ((*name).to_owned(), ty(space, id)))
                                        .collect(),
                                ),
                            };
                            (name.to_owned(), shape)
                        })
                        .collect(),
                ),
                TypeDetails::Newtype(n) => Def::Newtype(ty(space, &n.inner())),
                _ => continue,
            };
            defs.insert(t.name(), def);
        }
        let mut squashed: HashMap<String, Vec<String>> = HashMap::new();
        for name in defs.keys() {
            squashed.entry(squash(name)).or_default().push(name.clone());
        }
        RustTypes { defs, squashed }
    }
}

fn ty(space: &TypeSpace, id: &TypeId) -> Ty {
    let Ok(t) = space.get_type(id) else {
        return Ty::Builtin("?".into());
    };
    let details = t.details();
    match details {
        TypeDetails::Struct(_) | TypeDetails::Enum(_) | TypeDetails::Newtype(_) => {
            Ty::Named(t.name())
        }
        TypeDetails::Option(id) => Ty::Option(Box::new(ty(space, &id))),
        TypeDetails::Vec(id) => Ty::Vec(Box::new(ty(space, &id))),
        TypeDetails::Set(id) => Ty::Set(Box::new(ty(space, &id))),
        TypeDetails::Box(id) => Ty::Box(Box::new(ty(space, &id))),
        TypeDetails::Map(k, v) => Ty::Map(Box::new(ty(space, &k)), Box::new(ty(space, &v))),
        TypeDetails::Tuple(ids) => Ty::Tuple(ids.map(|id| ty(space, &id)).collect()),
        TypeDetails::Array(id, n) => Ty::Array(Box::new(ty(space, &id)), n),
        TypeDetails::Builtin(name) => Ty::Builtin(name.to_owned()),
        TypeDetails::String => Ty::String,
        TypeDetails::Unit => Ty::Unit,
    }
}

impl Ty {
    /// The type as a reader writes it: `Option<Vec<Uuid>>`, `DateTime<Utc>`.
    fn text(&self) -> String {
        match self {
            Ty::Named(n) => n.clone(),
            Ty::Builtin(b) => short_path(b),
            Ty::String => "String".into(),
            Ty::Unit => "()".into(),
            Ty::Option(t) => format!("Option<{}>", t.text()),
            Ty::Vec(t) => format!("Vec<{}>", t.text()),
            Ty::Set(t) => format!("Set<{}>", t.text()),
            Ty::Box(t) => format!("Box<{}>", t.text()),
            Ty::Map(k, v) => format!("Map<{}, {}>", k.text(), v.text()),
            Ty::Tuple(list) => format!(
                "({})",
                list.iter().map(Ty::text).collect::<Vec<_>>().join(", ")
            ),
            Ty::Array(t, n) => format!("[{}; {n}]", t.text()),
        }
    }
}

/// `::chrono::DateTime<::chrono::offset::Utc>` as `DateTime<Utc>`.
fn short_path(path: &str) -> String {
    let mut out = String::new();
    let mut segment = String::new();
    for c in path.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            out.push_str(segment.rsplit("::").next().unwrap_or(""));
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(segment.rsplit("::").next().unwrap_or(""));
    out
}

impl Def {
    fn kind(&self) -> &'static str {
        match self {
            Def::Struct(_) => "a struct",
            Def::Enum(_) => "an enum",
            Def::Newtype(_) => "a newtype",
        }
    }
}

/// One event's two sides: its released and current schema, the types generated for each,
/// and the root type names (the titles).
pub(crate) struct Sides<'a> {
    pub(crate) old_schema: &'a Value,
    pub(crate) new_schema: &'a Value,
    pub(crate) old_types: &'a RustTypes,
    pub(crate) new_types: &'a RustTypes,
    pub(crate) old_title: &'a str,
    pub(crate) new_title: &'a str,
}

/// The rust-level changes of one event.
pub(crate) fn compare(sides: &Sides<'_>) -> Vec<Change> {
    let mut walk = Walk {
        sides,
        seen: HashSet::new(),
        renames: Vec::new(),
        changes: Vec::new(),
    };
    let root = Spot {
        old: Some((sides.old_schema, String::new())),
        new: Some((sides.new_schema, String::new())),
    };
    walk.named(sides.old_title, sides.new_title, &root, None);
    walk.removed_types();
    walk.changes
}

/// Where a Rust type comes from on each side: the schema node and its pointer.
#[derive(Clone, Default)]
struct Spot<'a> {
    old: Option<(&'a Value, String)>,
    new: Option<(&'a Value, String)>,
}

impl<'a> Spot<'a> {
    fn pointer(&self) -> String {
        self.new
            .as_ref()
            .or(self.old.as_ref())
            .map(|(_, p)| p.clone())
            .unwrap_or_default()
    }

    fn old_pointer(&self) -> String {
        self.old
            .as_ref()
            .or(self.new.as_ref())
            .map(|(_, p)| p.clone())
            .unwrap_or_default()
    }

    /// The same step on both sides: `f` gets the side's root, the node (its `$ref`s
    /// followed) and its pointer.
    fn map(
        &self,
        sides: &Sides<'a>,
        f: impl Fn(&'a Value, &'a Value, &str) -> Option<(&'a Value, String)>,
    ) -> Spot<'a> {
        let side = |side: &Option<(&'a Value, String)>, root: &'a Value| {
            side.as_ref().and_then(|(node, at)| {
                let (node, at) = follow(root, node, at);
                f(root, node, &at)
            })
        };
        Spot {
            old: side(&self.old, sides.old_schema),
            new: side(&self.new, sides.new_schema),
        }
    }

    /// The same places with their `$ref`s followed: where a generated type is defined.
    fn followed(&self, sides: &Sides<'a>) -> Spot<'a> {
        self.map(sides, |_, node, at| Some((node, at.to_owned())))
    }

    /// Where an enum's variants come from: its `enum` keyword when it has one.
    fn variants(&self) -> (String, String) {
        let at = |side: &Option<(&'a Value, String)>| {
            side.as_ref().map(|(node, at)| {
                if node.get("enum").is_some() {
                    format!("{at}/enum")
                } else {
                    at.clone()
                }
            })
        };
        let (old, new) = (at(&self.old), at(&self.new));
        (
            old.clone().or(new.clone()).unwrap_or_default(),
            new.or(old).unwrap_or_default(),
        )
    }

    /// The property a struct field comes from.
    fn field(&self, sides: &Sides<'a>, field: &str) -> Spot<'a> {
        self.map(sides, |root, node, at| property_of(root, node, at, field))
    }

    fn items(&self, sides: &Sides<'a>) -> Spot<'a> {
        self.map(sides, |_, node, at| {
            node.get("items")
                .filter(|i| i.is_object() || i.is_boolean())
                .map(|i| (i, format!("{at}/items")))
        })
    }

    fn additional(&self, sides: &Sides<'a>) -> Spot<'a> {
        self.map(sides, |_, node, at| {
            node.get("additionalProperties")
                .map(|i| (i, format!("{at}/additionalProperties")))
        })
    }
}

/// `node` with its `$ref`s followed (a few hops at most).
fn follow<'a>(root: &'a Value, node: &'a Value, at: &str) -> (&'a Value, String) {
    let (mut node, mut at) = (node, at.to_owned());
    for _ in 0..8 {
        let Some(reference) = node.get("$ref").and_then(Value::as_str) else {
            break;
        };
        let Some(pointer) = reference
            .strip_prefix('#')
            .map(outbox_schema::pointer::percent_decode)
        else {
            break;
        };
        match root.pointer(&pointer) {
            Some(target) => {
                node = target;
                at = pointer;
            }
            None => break,
        }
    }
    (node, at)
}

/// The property of `node` (or of its `allOf` branches) that typify named `field`: the same
/// name, or the same letters and digits regardless of case and separators (`invoiceId` is
/// `invoice_id`, `type` is `type_`). `extra` is the map of `additionalProperties`.
fn property_of<'a>(
    root: &'a Value,
    node: &'a Value,
    at: &str,
    field: &str,
) -> Option<(&'a Value, String)> {
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        let found = props
            .get_key_value(field)
            .or_else(|| props.iter().find(|(name, _)| squash(name) == squash(field)));
        if let Some((name, schema)) = found {
            let token = outbox_schema::pointer::escape_token(name);
            return Some((schema, format!("{at}/properties/{token}")));
        }
    }
    if let Some(branches) = node.get("allOf").and_then(Value::as_array) {
        for (i, branch) in branches.iter().enumerate() {
            let (branch, branch_at) = follow(root, branch, &format!("{at}/allOf/{i}"));
            if let Some(found) = property_of(root, branch, &branch_at, field) {
                return Some(found);
            }
        }
    }
    if field == "extra" {
        return node
            .get("additionalProperties")
            .map(|a| (a, format!("{at}/additionalProperties")));
    }
    None
}

struct Walk<'s, 'a> {
    sides: &'s Sides<'a>,
    /// Pairs of type names already compared.
    seen: HashSet<(String, String)>,
    /// Every (old, new) pair of names that differ, reported or implied by a parent's rename.
    renames: Vec<(String, String)>,
    changes: Vec<Change>,
}

impl<'a> Walk<'_, 'a> {
    fn push(&mut self, rule: Rule, pointer: String, message: String) {
        self.changes.push(Change {
            rule,
            pointer,
            via: None,
            message,
            breaks: Breaks::BOTH,
        });
    }

    /// A rename that follows from a parent's (`SubscriptionCreatedTrial` when
    /// `SubscriptionCreated` became `SubscriptionStarted`).
    fn implied(&self, old: &str, new: &str) -> bool {
        self.renames.iter().any(|(po, pn)| {
            match (old.strip_prefix(po.as_str()), new.strip_prefix(pn.as_str())) {
                (Some(a), Some(b)) => a == b && !a.is_empty(),
                _ => false,
            }
        })
    }

    /// Two generated types in the same place; `what` says where (`None` for the event).
    fn named(&mut self, old: &str, new: &str, spot: &Spot<'a>, what: Option<&str>) {
        if old != new {
            if !self.implied(old, new) {
                let (pointer, message) = match what {
                    None => (
                        "/title".to_owned(),
                        format!(
                            "the event's Rust type `{old}` is now `{new}` (its `title` changed)"
                        ),
                    ),
                    Some(what) => (
                        spot.pointer(),
                        format!("the Rust type of {what} is now `{new}` instead of `{old}`"),
                    ),
                };
                self.push(Rule::RustTypeRenamed, pointer, message);
            }
            self.renames.push((old.to_owned(), new.to_owned()));
        }
        if !self.seen.insert((old.to_owned(), new.to_owned())) {
            return;
        }
        let (Some(od), Some(nd)) = (
            self.sides.old_types.defs.get(old),
            self.sides.new_types.defs.get(new),
        ) else {
            return;
        };
        let spot = &spot.followed(self.sides);
        match (od, nd) {
            (Def::Struct(of), Def::Struct(nf)) => self.fields(old, new, of, nf, spot),
            (Def::Enum(ov), Def::Enum(nv)) => self.variants(old, new, ov, nv, spot),
            (Def::Newtype(a), Def::Newtype(b)) => {
                self.ty(a, b, spot, &format!("the newtype `{new}`"));
            }
            _ => self.push(
                Rule::RustTypeChanged,
                spot.pointer(),
                format!("`{old}` was {} and `{new}` is {}", od.kind(), nd.kind()),
            ),
        }
    }

    fn fields(
        &mut self,
        old: &str,
        new: &str,
        of: &[(String, Ty)],
        nf: &[(String, Ty)],
        spot: &Spot<'a>,
    ) {
        for (name, old_ty) in of {
            let here = spot.field(self.sides, name);
            match nf.iter().find(|(n, _)| n == name) {
                Some((_, new_ty)) => {
                    self.ty(old_ty, new_ty, &here, &format!("field `{name}` of `{new}`"));
                }
                None => self.push(
                    Rule::RustFieldRemoved,
                    here.old_pointer(),
                    format!("field `{name}` of `{old}` is gone"),
                ),
            }
        }
    }

    fn variants(
        &mut self,
        old: &str,
        new: &str,
        ov: &[(String, Shape)],
        nv: &[(String, Shape)],
        spot: &Spot<'a>,
    ) {
        let (old_at, new_at) = spot.variants();
        for (name, old_shape) in ov {
            match nv.iter().find(|(n, _)| n == name) {
                None => self.push(
                    Rule::RustVariantRemoved,
                    old_at.clone(),
                    format!("variant `{old}::{name}` is gone"),
                ),
                Some((_, new_shape)) => match (old_shape, new_shape) {
                    (Shape::Unit, Shape::Unit) => {}
                    (Shape::Tuple(a), Shape::Tuple(b)) if a.len() == b.len() => {
                        for (a, b) in a.iter().zip(b) {
                            self.ty(a, b, spot, &format!("variant `{new}::{name}`"));
                        }
                    }
                    (Shape::Struct(a), Shape::Struct(b)) => {
                        for (field, a_ty) in a {
                            match b.iter().find(|(f, _)| f == field) {
                                Some((_, b_ty)) => self.ty(
                                    a_ty,
                                    b_ty,
                                    spot,
                                    &format!("field `{field}` of variant `{new}::{name}`"),
                                ),
                                None => self.push(
                                    Rule::RustFieldRemoved,
                                    spot.old_pointer(),
                                    format!("field `{field}` of variant `{old}::{name}` is gone"),
                                ),
                            }
                        }
                    }
                    _ => self.push(
                        Rule::RustFieldTypeChanged,
                        spot.pointer(),
                        format!("variant `{new}::{name}` holds other data than `{old}::{name}`"),
                    ),
                },
            }
        }
        for (name, _) in nv {
            if !ov.iter().any(|(n, _)| n == name) {
                self.push(
                    Rule::RustVariantAdded,
                    new_at.clone(),
                    format!("variant `{new}::{name}` added: an exhaustive `match` on `{new}` no longer compiles"),
                );
            }
        }
    }

    fn ty(&mut self, old: &Ty, new: &Ty, spot: &Spot<'a>, what: &str) {
        match (old, new) {
            (Ty::Named(a), Ty::Named(b)) => self.named(a, b, spot, Some(what)),
            (Ty::Option(a), Ty::Option(b)) | (Ty::Box(a), Ty::Box(b)) => self.ty(a, b, spot, what),
            (Ty::Vec(a), Ty::Vec(b)) | (Ty::Set(a), Ty::Set(b)) => {
                self.ty(
                    a,
                    b,
                    &spot.items(self.sides),
                    &format!("the items of {what}"),
                );
            }
            (Ty::Map(ka, va), Ty::Map(kb, vb)) if ka == kb => {
                self.ty(
                    va,
                    vb,
                    &spot.additional(self.sides),
                    &format!("the values of {what}"),
                );
            }
            (Ty::Array(a, n), Ty::Array(b, m)) if n == m => {
                self.ty(
                    a,
                    b,
                    &spot.items(self.sides),
                    &format!("the items of {what}"),
                );
            }
            (Ty::Tuple(a), Ty::Tuple(b)) if a.len() == b.len() => {
                for (a, b) in a.iter().zip(b) {
                    self.ty(a, b, spot, what);
                }
            }
            _ if old == new => {}
            _ => self.push(
                Rule::RustFieldTypeChanged,
                spot.pointer(),
                format!("{what} is now `{}` instead of `{}`", new.text(), old.text()),
            ),
        }
    }

    /// Definitions whose types no longer exist (and were not renamed). Inline types that
    /// disappear are not listed: the field that held them says it.
    fn removed_types(&mut self) {
        for keyword in ["$defs", "definitions"] {
            let Some(defs) = self
                .sides
                .old_schema
                .get(keyword)
                .and_then(Value::as_object)
            else {
                continue;
            };
            for def in defs.keys() {
                let Some(names) = self.sides.old_types.squashed.get(&squash(def)) else {
                    continue;
                };
                for name in names {
                    if self.sides.new_types.defs.contains_key(name)
                        || self.renames.iter().any(|(o, _)| o == name)
                    {
                        continue;
                    }
                    let token = outbox_schema::pointer::escape_token(def);
                    self.push(
                        Rule::RustTypeRemoved,
                        format!("/{keyword}/{token}"),
                        format!("the Rust type `{name}` is gone"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_shortened() {
        assert_eq!(
            short_path("::chrono::DateTime<::chrono::offset::Utc>"),
            "DateTime<Utc>"
        );
        assert_eq!(short_path("::std::num::NonZeroU64"), "NonZeroU64");
        assert_eq!(short_path("i64"), "i64");
        assert_eq!(
            Ty::Option(Box::new(Ty::Vec(Box::new(Ty::Builtin(
                "::uuid::Uuid".into()
            )))))
            .text(),
            "Option<Vec<Uuid>>"
        );
    }
}
