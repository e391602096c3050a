//! What a replica's engine does with its link ([`Role`]): in cluster mode only the Lease
//! holder decides, and a replica without it follows the holder's view.

/// What the engine does with the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads the remote, publishes, and acts on the floods it measures (standalone mode, or
    /// the Lease holder).
    Deciding,
    /// Reads the remote and measures floods, acting on none: another replica holds the Lease.
    Measuring,
    /// Follows the Lease holder's view version for version: publishes nothing, decides nothing.
    Following,
    /// Has taken the Lease while its view still follows the old holder's: decides, publishes
    /// nothing until [`super::Engine::adopt_view`] takes the view over.
    TakingOver,
}

impl Role {
    /// Whether it acts on floods.
    pub fn decides(self) -> bool {
        matches!(self, Role::Deciding | Role::TakingOver)
    }

    /// Whether its view follows the holder's (it publishes nothing).
    pub fn follows(self) -> bool {
        matches!(self, Role::Following | Role::TakingOver)
    }

    /// The role once the replica takes (`true`) or loses the Lease.
    pub fn deciding(self, deciding: bool) -> Role {
        match (self.follows(), deciding) {
            (false, true) => Role::Deciding,
            (false, false) => Role::Measuring,
            (true, true) => Role::TakingOver,
            (true, false) => Role::Following,
        }
    }

    /// The role once its view follows the holder's.
    pub fn following(self) -> Role {
        if self.decides() {
            Role::TakingOver
        } else {
            Role::Following
        }
    }

    /// The role once it publishes into its view again.
    pub fn adopted(self) -> Role {
        if self.decides() {
            Role::Deciding
        } else {
            Role::Measuring
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Role;

    /// Every transition: taking and losing the Lease, following, taking the view over.
    #[test]
    fn each_transition_lands_where_the_replica_is() {
        assert_eq!(Role::Deciding.deciding(false), Role::Measuring);
        assert_eq!(Role::Measuring.deciding(true), Role::Deciding);
        assert_eq!(Role::Measuring.following(), Role::Following);
        assert_eq!(Role::Following.deciding(true), Role::TakingOver);
        assert_eq!(Role::TakingOver.adopted(), Role::Deciding);
        assert_eq!(Role::TakingOver.deciding(false), Role::Following);
        assert_eq!(Role::Following.adopted(), Role::Measuring);
        assert_eq!(Role::Deciding.following(), Role::TakingOver);
        for r in [
            Role::Deciding,
            Role::Measuring,
            Role::Following,
            Role::TakingOver,
        ] {
            assert_eq!(r.deciding(r.decides()), r, "{r:?} stays");
        }
    }
}
