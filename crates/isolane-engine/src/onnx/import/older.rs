//! Opsets 7–12: the signatures that changed by opset 13.
//!
//! Most changes moved an attribute to an input (Slice at 10, Pad and Clip at 11, Squeeze,
//! Unsqueeze and Split at 13). Such a node is rewritten into its newer form — the attribute's
//! value becomes a constant input — and handed to the newer handler, so both forms share one
//! implementation and every check. The older forms' import functions live with their op
//! families (`crate::ops`: `clip_v6`, `slice_v1`, `pad_v2`, `squeeze_v1`, `split_v2`, and
//! `softmax_v1` and `upsample`, whose meaning changed: Softmax before 13 coerces its input to
//! 2-D, and Upsample (7–9) and Resize-10 compute source coordinates as `out / scale`, what
//! onnxruntime does for them); this is the rewrite they share.

use super::*;

impl Importer<'_> {
    /// Runs `handler` on a copy of node `c` in its newer form: `inputs` puts a value (or
    /// nothing: an empty input name) at an input position, `drop` removes attributes the
    /// caller has read and turned into inputs, `add` sets attributes. Messages still name the
    /// node as the file has it; every attribute the copy keeps must be read by the handler.
    pub(crate) fn as_newer_form(
        &mut self,
        c: &Ctx,
        inputs: Vec<(usize, Option<Val>)>,
        drop: &[&str],
        add: Vec<AttributeProto>,
        handler: fn(&mut Self, &Ctx) -> Result<Vec<Val>>,
    ) -> Result<Vec<Val>> {
        for name in drop {
            c.ignore(name);
        }
        let mut n = c.n.clone();
        n.attribute.retain(|a| !drop.contains(&a.name()));
        n.attribute
            .retain(|a| !add.iter().any(|b| b.name() == a.name()));
        n.attribute.extend(add);
        for (pos, v) in inputs {
            if n.input.len() <= pos {
                n.input.resize(pos + 1, String::new());
            }
            n.input[pos] = match v {
                None => String::new(),
                Some(v) => {
                    self.fresh += 1;
                    let name = format!("{}:input{pos}:{}", c.r.node, self.fresh);
                    self.vals.insert(name.clone(), v);
                    name
                }
            };
        }
        let newer = Ctx {
            n: &n,
            r: c.r.clone(),
            path: c.path,
            read: RefCell::new(vec![false; n.attribute.len()]),
        };
        let out = handler(self, &newer)?;
        newer.check_all_read()?;
        // The copy's handler read (or refused) every attribute the original still had.
        for a in &c.n.attribute {
            c.ignore(a.name());
        }
        Ok(out)
    }
}
