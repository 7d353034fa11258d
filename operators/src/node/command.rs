//! Commands a node takes on its control input: the allocator's, the
//! trainer's and an operator's way to change a running node. Each command
//! is applied at an event time, between the requests before it and those
//! at or after it.

use serde::{Deserialize, Serialize};

use super::load::Backlog;
use super::{NodeParams, ServeError, ServingNode};

/// A change to a running node. New kinds (model weights, LoRA deltas, the
/// prefix policy) are new variants; `ServingNode::apply` must handle each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeCommand {
    /// Moves the EMB/KV boundary of the memory pool to `alpha` (HLEM §IV-B).
    SetAlpha(f64),
    /// Serves the trained model in directory `path` (whose version must be
    /// `version`) from now on. It carries no weights: whoever delivers it
    /// loads them and calls [`ServingNode::swap_model`].
    SwapModel { path: String, version: String },
    /// An operator pins α (`Some`): the node moves there and refuses the
    /// allocator's `SetAlpha` until released (`None`), when the allocator's
    /// next decision applies again (HLEM §IV-A's runtime switch).
    PinAlpha(Option<f64>),
}

impl NodeCommand {
    /// Checks what can be checked without a node, so a bad command is
    /// refused where it is made rather than where it lands.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            NodeCommand::SetAlpha(alpha) if !(0.0..=1.0).contains(alpha) => {
                Err(format!("SetAlpha: alpha must be in [0, 1] (got {alpha})"))
            }
            NodeCommand::SetAlpha(_) => Ok(()),
            NodeCommand::SwapModel { path, version } if path.is_empty() || version.is_empty() => {
                Err("SwapModel: path and version must be given".into())
            }
            NodeCommand::SwapModel { .. } => Ok(()),
            NodeCommand::PinAlpha(Some(alpha)) if !(0.0..=1.0).contains(alpha) => {
                Err(format!("PinAlpha: alpha must be in [0, 1] (got {alpha})"))
            }
            NodeCommand::PinAlpha(_) => Ok(()),
        }
    }
}

/// What applying a command did, for logs and counters.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// The EMB share moved from `from` to `to` (pinned KV pages can keep
    /// it short of the target); `pages_to_emb` pages changed sides.
    Alpha {
        from: f64,
        to: f64,
        pages_to_emb: i64,
    },
    /// The node serves model `to` instead of `from`, with empty caches.
    Model { from: String, to: String },
    /// α is pinned at `alpha` by the operator (after moving there), or
    /// released to the allocator (`None`).
    Pin { alpha: Option<f64> },
}

impl ServingNode {
    /// Serves the model in `params` from now on (between batches). Nothing
    /// computed under the old weights survives: the node's memory (EMB rows,
    /// user-prefix and item KV) starts empty, as does what it told the
    /// routers about residency; counters, α, lanes, the clock and the load
    /// model carry over. The old model is dropped once the new one is
    /// built, so a node holds two models only during the swap. On error
    /// the old model keeps serving.
    pub fn swap_model(&mut self, params: NodeParams) -> Result<Applied, ServeError> {
        let mut next = ServingNode::new(self.id, params)?;
        next.set_alpha(self.alpha())?;
        next.counters = std::mem::take(&mut self.counters);
        next.lanes = self.lanes;
        next.virtual_compute = self.virtual_compute.take();
        if next.virtual_compute.is_some() {
            next.memory.keep_metadata_only();
        }
        next.backlog = std::mem::replace(&mut self.backlog, Backlog::new(1.0));
        next.link_clock = self.link_clock;
        next.alpha_pin = self.alpha_pin;
        // What the routers were told stays known, recounted against the
        // empty memory, so that the next report takes back every user and
        // shard that is gone (routers kept them as resident before).
        next.residency = std::mem::take(&mut self.residency);
        next.residency.recheck_users();
        next.recount_shards();
        // Cumulative: the new prefix table counts from zero.
        next.head_evictions_before = self.head_evictions_before + self.prefixes.evictions();
        let from = std::mem::replace(self, next).model_version;
        Ok(Applied::Model {
            from,
            to: self.model_version.clone(),
        })
    }

    /// Applies `command`, stamped `now_ms` in event time: the caller decides
    /// when.
    pub fn apply(&mut self, command: &NodeCommand, now_ms: u64) -> Result<Applied, ServeError> {
        match *command {
            NodeCommand::SwapModel { .. } => Err(ServeError::Model(
                "SwapModel needs the model's parameters: deliver it with swap_model".into(),
            )),
            NodeCommand::PinAlpha(pin) => {
                if let Some(alpha) = pin {
                    self.set_alpha_at(alpha, now_ms)?;
                }
                self.alpha_pin = pin;
                Ok(Applied::Pin {
                    alpha: pin.map(|_| self.alpha()),
                })
            }
            NodeCommand::SetAlpha(_) if self.alpha_pin.is_some() => {
                Err(ServeError::AlphaPinned(self.alpha_pin.expect("checked")))
            }
            NodeCommand::SetAlpha(alpha) => {
                let from = self.alpha();
                let moved = self.set_alpha_at(alpha, now_ms)?;
                Ok(Applied::Alpha {
                    from,
                    to: moved.alpha,
                    pages_to_emb: moved.pages_to_emb,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_params;
    use super::*;

    #[test]
    fn set_alpha_moves_the_boundary_and_says_how_far() {
        let mut node = ServingNode::new(0, test_params()).unwrap();
        assert_eq!(node.alpha(), 0.5);
        let applied = node.apply(&NodeCommand::SetAlpha(0.25), 0).unwrap();
        let Applied::Alpha {
            from,
            to,
            pages_to_emb,
        } = applied
        else {
            panic!("SetAlpha moves alpha: {applied:?}");
        };
        assert_eq!(from, 0.5);
        assert!((to - 0.25).abs() < 0.01, "{to}");
        assert!(pages_to_emb < 0, "EMB gave pages back: {pages_to_emb}");
        assert_eq!(node.alpha(), to);
    }

    #[test]
    fn a_pinned_alpha_refuses_the_allocator_until_released() {
        let mut node = ServingNode::new(0, test_params()).unwrap();
        let pinned = node.apply(&NodeCommand::PinAlpha(Some(0.25)), 0).unwrap();
        let pinned_at = node.alpha();
        assert!((pinned_at - 0.25).abs() < 0.01, "{pinned_at}");
        assert_eq!(
            pinned,
            Applied::Pin {
                alpha: Some(pinned_at)
            }
        );
        let refused = node.apply(&NodeCommand::SetAlpha(0.75), 0).unwrap_err();
        assert!(matches!(refused, ServeError::AlphaPinned(_)), "{refused}");
        assert_eq!(node.alpha(), pinned_at, "the allocator moved nothing");
        assert_eq!(
            node.apply(&NodeCommand::PinAlpha(None), 0).unwrap(),
            Applied::Pin { alpha: None }
        );
        assert_eq!(node.alpha(), pinned_at, "releasing does not move α");
        node.apply(&NodeCommand::SetAlpha(0.75), 0).unwrap();
        assert!((node.alpha() - 0.75).abs() < 0.01);
        assert!(NodeCommand::PinAlpha(Some(1.5)).validate().is_err());
        assert!(NodeCommand::PinAlpha(None).validate().is_ok());
    }

    #[test]
    fn a_bad_command_is_refused_where_it_is_made_and_where_it_lands() {
        for alpha in [1.5, -0.1, f64::NAN] {
            assert!(NodeCommand::SetAlpha(alpha).validate().is_err(), "{alpha}");
        }
        assert!(NodeCommand::SetAlpha(0.0).validate().is_ok());
        let mut node = ServingNode::new(0, test_params()).unwrap();
        assert!(node.apply(&NodeCommand::SetAlpha(1.5), 0).is_err());
        assert_eq!(node.alpha(), 0.5, "a refused command changes nothing");
    }
}
