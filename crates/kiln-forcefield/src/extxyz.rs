//! Extended XYZ, as ASE reads and writes it: per frame a count line, a comment line of
//! `key=value` pairs (`Lattice="ax ay az bx by bz cx cy cz"`, `pbc="T T F"`,
//! `Properties=species:S:1:pos:R:3:...`, `energy=...`) and one line per atom with the columns
//! `Properties` declares. Errors name the line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::ForceFieldError;
use crate::elements::{ELEMENTS, atomic_number};
use crate::structure::Structure;

/// One frame: its structure, the comment line's other `key=value` pairs, and per-atom float
/// columns other than the positions (e.g. `forces`), row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Elements, positions, cell and periodicity.
    pub structure: Structure,
    /// The comment line's pairs other than Lattice, pbc and Properties (e.g. `energy`).
    pub info: BTreeMap<String, String>,
    /// Per-atom real columns other than `pos`, by name: `count` values per atom, row-major.
    pub arrays: BTreeMap<String, (usize, Vec<f64>)>,
    /// Atoms whose species is not an element, with the symbol as written (kept when the frame
    /// is written back); their atomic number is 0, which no model accepts.
    pub unknown_species: BTreeMap<usize, String>,
    /// The 1-based line of the frame's atom count in the file it was read from (0 for a frame
    /// made in code), for messages about it.
    pub line: usize,
}

impl Frame {
    /// A frame of `structure` with nothing else.
    pub fn new(structure: Structure) -> Self {
        Frame {
            structure,
            info: BTreeMap::new(),
            arrays: BTreeMap::new(),
            unknown_species: BTreeMap::new(),
            line: 0,
        }
    }

    /// Why the frame's structure cannot be evaluated by a model embedding elements below
    /// `max_z`; `index` names it.
    pub fn validate(&self, index: usize, max_z: usize) -> Result<(), ForceFieldError> {
        if let Some((atom, symbol)) = self.unknown_species.first_key_value() {
            return Err(ForceFieldError::Structure {
                index,
                reason: format!("atom {} has unknown element `{symbol}`", atom + 1),
            });
        }
        self.structure.validate(index, max_z)
    }
}

/// Why a file is not extended XYZ kiln can read: the line (1-based) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ExtxyzError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// Every frame of `text`.
pub fn read_extxyz(text: &str) -> Result<Vec<Frame>, ExtxyzError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut frames = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        if lines[at].trim().is_empty() {
            at += 1;
            continue;
        }
        let fail = |line: usize, reason: String| ExtxyzError {
            line: line + 1,
            reason,
        };
        let count: usize = lines[at]
            .trim()
            .parse()
            .map_err(|_| fail(at, format!("`{}` is not an atom count", lines[at].trim())))?;
        let comment = lines
            .get(at + 1)
            .ok_or_else(|| fail(at + 1, "missing comment line".into()))?;
        let mut info = parse_pairs(comment).map_err(|reason| fail(at + 1, reason))?;
        let columns = parse_properties(info.remove("Properties").as_deref())
            .map_err(|reason| fail(at + 1, reason))?;
        let cell = match info.remove("Lattice") {
            Some(lattice) => {
                let v = floats(&lattice).map_err(|reason| fail(at + 1, reason))?;
                if v.len() != 9 {
                    return Err(fail(
                        at + 1,
                        format!("Lattice has {} numbers, not 9", v.len()),
                    ));
                }
                std::array::from_fn(|r| std::array::from_fn(|c| v[3 * r + c]))
            }
            None => [[0.0; 3]; 3],
        };
        let pbc = match info.remove("pbc") {
            Some(text) => {
                let flags: Vec<bool> = text
                    .split_whitespace()
                    .map(|t| matches!(t, "T" | "True" | "true" | "1"))
                    .collect();
                if flags.len() != 3 {
                    return Err(fail(at + 1, format!("pbc `{text}` is not three flags")));
                }
                [flags[0], flags[1], flags[2]]
            }
            None => [cell != [[0.0; 3]; 3]; 3],
        };
        let width: usize = columns.iter().map(|c| c.count).sum(); // checked by parse_properties
        // No more atoms than lines left: a declared count is not trusted with memory.
        let room = count.min(lines.len().saturating_sub(at + 2));
        let (mut numbers, mut positions) = (Vec::with_capacity(room), Vec::with_capacity(room));
        let mut unknown_species = BTreeMap::new();
        let mut arrays: BTreeMap<String, (usize, Vec<f64>)> = columns
            .iter()
            .filter(|c| c.kind == 'R' && c.name != "pos")
            .map(|c| (c.name.clone(), (c.count, Vec::new())))
            .collect();
        for atom in 0..count {
            let index = at + 2 + atom;
            let line = lines.get(index).ok_or_else(|| {
                fail(
                    index,
                    format!("the frame ends after {atom} of {count} atoms"),
                )
            })?;
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [alone] = fields[..]
                && width > 1
                && alone.parse::<usize>().is_ok()
            {
                // The next frame's atom count: this frame declared more atoms than it has.
                return Err(fail(
                    at,
                    format!(
                        "the frame declares {count} atoms but has {atom}: line {} starts the next \
                         frame",
                        index + 1
                    ),
                ));
            }
            if fields.len() != width {
                return Err(fail(
                    index,
                    format!("{} columns, Properties declares {width}", fields.len()),
                ));
            }
            let mut field = 0;
            for column in &columns {
                let values = &fields[field..field + column.count];
                field += column.count;
                match (column.name.as_str(), column.kind) {
                    ("species", 'S') => {
                        numbers.push(atomic_number(values[0]).unwrap_or_else(|| {
                            unknown_species.insert(atom, values[0].to_string());
                            0
                        }))
                    }
                    ("Z", 'I') => numbers.push(values[0].parse().map_err(|_| {
                        fail(index, format!("`{}` is not an atomic number", values[0]))
                    })?),
                    (name, 'R') => {
                        let parsed = values
                            .iter()
                            .map(|v| v.parse::<f64>())
                            .collect::<Result<Vec<f64>, _>>()
                            .map_err(|_| {
                                fail(
                                    index,
                                    format!("`{}` has a value that is not a number", name),
                                )
                            })?;
                        if name == "pos" {
                            positions.push([parsed[0], parsed[1], parsed[2]]);
                        } else if let Some((_, values)) = arrays.get_mut(name) {
                            values.extend(parsed);
                        }
                    }
                    _ => {}
                }
            }
        }
        if numbers.len() != count || positions.len() != count {
            return Err(fail(
                at + 1,
                "Properties lacks species (or Z) and pos".into(),
            ));
        }
        frames.push(Frame {
            structure: Structure::periodic(numbers, positions, cell, pbc),
            info,
            arrays,
            unknown_species,
            line: at + 1,
        });
        at += 2 + count;
    }
    Ok(frames)
}

/// `frames` as extended XYZ that ASE reads: species, positions and every array as columns,
/// the info pairs (numbers bare, text quoted) on the comment line.
pub fn write_extxyz(frames: &[Frame]) -> String {
    let mut out = String::new();
    for frame in frames {
        let s = &frame.structure;
        let _ = writeln!(out, "{}", s.len());
        let mut comment = Vec::new();
        if s.pbc.iter().any(|&p| p) || s.cell != [[0.0; 3]; 3] {
            let lattice: Vec<String> = s
                .cell
                .iter()
                .flatten()
                .map(|v| format!("{v:.10}"))
                .collect();
            comment.push(format!("Lattice=\"{}\"", lattice.join(" ")));
        }
        let mut properties = String::from("species:S:1:pos:R:3");
        for (name, (count, _)) in &frame.arrays {
            let _ = write!(properties, ":{name}:R:{count}");
        }
        comment.push(format!("Properties={properties}"));
        for (key, value) in &frame.info {
            if value.parse::<f64>().is_ok() {
                comment.push(format!("{key}={value}"));
            } else {
                comment.push(format!("{key}=\"{value}\""));
            }
        }
        let flags: Vec<&str> = s.pbc.iter().map(|&p| if p { "T" } else { "F" }).collect();
        comment.push(format!("pbc=\"{}\"", flags.join(" ")));
        let _ = writeln!(out, "{}", comment.join(" "));
        for (atom, (z, r)) in s.numbers.iter().zip(&s.positions).enumerate() {
            let symbol = match frame.unknown_species.get(&atom) {
                Some(symbol) => symbol.as_str(),
                None => ELEMENTS.get(*z as usize).copied().unwrap_or("X"),
            };
            let _ = write!(
                out,
                "{symbol:<2} {:>16.8} {:>16.8} {:>16.8}",
                r[0], r[1], r[2]
            );
            for (count, values) in frame.arrays.values() {
                for v in &values[atom * count..(atom + 1) * count] {
                    let _ = write!(out, " {v:>16.8}");
                }
            }
            out.push('\n');
        }
    }
    out
}

/// One column group of `Properties`: name, type letter (S, R, I, L) and width.
struct Column {
    name: String,
    kind: char,
    count: usize,
}

fn parse_properties(text: Option<&str>) -> Result<Vec<Column>, String> {
    let text = text.unwrap_or("species:S:1:pos:R:3");
    let parts: Vec<&str> = text.split(':').collect();
    if !parts.len().is_multiple_of(3) {
        return Err(format!(
            "Properties `{text}` is not name:type:count triples"
        ));
    }
    let columns = parts
        .chunks(3)
        .map(|p| {
            let kind = p[1].chars().next().filter(|k| "SRIL".contains(*k));
            match (kind, p[2].parse::<usize>()) {
                (Some(kind), Ok(count)) if count > 0 => Ok(Column {
                    name: p[0].to_string(),
                    kind,
                    count,
                }),
                _ => Err(format!(
                    "Properties entry `{}` is not name:S|R|I|L:count",
                    p.join(":")
                )),
            }
        })
        .collect::<Result<Vec<Column>, String>>()?;
    if let Some(pos) = columns.iter().find(|c| c.name == "pos")
        && (pos.kind, pos.count) != ('R', 3)
    {
        return Err(format!(
            "Properties declares pos:{}:{}, not pos:R:3",
            pos.kind, pos.count
        ));
    }
    columns
        .iter()
        .try_fold(0usize, |width, c| width.checked_add(c.count))
        .ok_or_else(|| format!("Properties `{text}` declares more columns than a line can hold"))?;
    Ok(columns)
}

/// The `key=value` pairs of a comment line (values may be double-quoted).
fn parse_pairs(line: &str) -> Result<BTreeMap<String, String>, String> {
    let mut pairs = BTreeMap::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once('=')
            .ok_or_else(|| format!("`{rest}` is not key=value"))?;
        let key = key.trim().to_string();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted
                .find('"')
                .ok_or_else(|| format!("the value of `{key}` has no closing quote"))?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        pairs.insert(key, value.to_string());
        rest = remaining.trim_start();
    }
    Ok(pairs)
}

fn floats(text: &str) -> Result<Vec<f64>, String> {
    text.split_whitespace()
        .map(|v| {
            v.parse::<f64>()
                .map_err(|_| format!("`{v}` is not a number"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_errors_name_the_line() {
        let text = "2\nLattice=\"4 0 0 0 4 0 0 0 4\" Properties=species:S:1:pos:R:3:forces:R:3 energy=-1.5 pbc=\"T T F\"\nO 0 0 0 0.1 0.2 0.3\nH 0 0 1 -0.1 -0.2 -0.3\n1\nProperties=species:S:1:pos:R:3\nC 1 2 3\n";
        let frames = read_extxyz(text).unwrap();
        assert_eq!(frames.len(), 2);
        let first = &frames[0];
        assert_eq!(first.structure.numbers, vec![8, 1]);
        assert_eq!(first.structure.pbc, [true, true, false]);
        assert_eq!(first.structure.cell[1][1], 4.0);
        assert_eq!(first.info["energy"], "-1.5");
        assert_eq!(first.arrays["forces"].1[5], -0.3);
        assert_eq!(frames[1].structure.pbc, [false; 3]);
        assert_eq!(read_extxyz(&write_extxyz(&frames)).unwrap(), frames);

        // An unknown element spoils its frame only, and is written back as it was.
        let text = "2\nProperties=species:S:1:pos:R:3\nH 0 0 0\nQq 0 0 1\n";
        let frames = read_extxyz(text).unwrap();
        let err = frames[0].validate(7, 100).unwrap_err().to_string();
        assert_eq!(err, "structure 8: atom 2 has unknown element `Qq`");
        assert!(write_extxyz(&frames).contains("\nQq "));
        let err = read_extxyz("2\n\nO 0 0 0\n").unwrap_err();
        assert_eq!(err.line, 4, "{err}");
        let err = read_extxyz("1\n\nO 0 0\n").unwrap_err();
        assert!(err.to_string().starts_with("line 3:"), "{err}");
        // A count larger than the atoms present is reported at the frame's count line.
        let text = "1\n\nH 0 0 0\n3\n\nH 0 0 0\nH 0 0 1\n2\n\nO 0 0 0\nO 0 0 1\n";
        let err = read_extxyz(text).unwrap_err().to_string();
        assert_eq!(
            err,
            "line 4: the frame declares 3 atoms but has 2: line 8 starts the next frame"
        );
    }
}
