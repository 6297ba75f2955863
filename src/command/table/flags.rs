//! What the table says about each command beyond its arguments: its flags and its ACL
//! categories. Both are enums, so a misspelt one fails to compile, gathered in small bit sets,
//! so dispatch tests one with a mask instead of searching a list of strings. The Redis spellings
//! (`no-auth`, `@semaphore`) are here for the places that show or read them: `COMMAND INFO`,
//! `ACL CAT`, ACL rules and `docs/commands.md`.

/// Defines a set of `$item`s made from a list written in the table. The set keeps that list,
/// because `COMMAND INFO` shows the members in the order each entry gives them and no single
/// order fits every entry (PING says `fast, stale`, CLIENT ID `stale, fast`); its bits answer
/// membership.
macro_rules! listed_set {
    ($(#[$doc:meta])* $set:ident of $item:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $set {
            bits: u32,
            listed: &'static [$item],
        }

        impl $set {
            /// The set of `listed`. Naming a member twice is an error, and as the table is built
            /// at compile time, one there stops the build.
            pub const fn of(listed: &'static [$item]) -> $set {
                let mut bits = 0;
                let mut i = 0;
                while i < listed.len() {
                    let bit = 1 << listed[i] as u32;
                    assert!(bits & bit == 0, "a member is listed twice");
                    bits |= bit;
                    i += 1;
                }
                $set { bits, listed }
            }

            /// Whether `item` is a member.
            pub const fn has(self, item: $item) -> bool {
                self.bits & (1 << item as u32) != 0
            }

            /// Whether there are no members.
            pub const fn is_empty(self) -> bool {
                self.bits == 0
            }

            /// The members, in the order the table lists them.
            pub fn iter(self) -> impl Iterator<Item = $item> {
                self.listed.iter().copied()
            }
        }
    };
}

/// A command flag. Dispatch acts on [`Flag::NoAuth`] and [`Flag::NoMulti`], `COMMAND INFO`'s
/// key specs on [`Flag::Write`]; the others only inform Redis tools and client libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// Changes state (its key spec says `RW`, `UPDATE`).
    Write,
    /// Only reads (its key spec says `RO`, `ACCESS`).
    Readonly,
    /// For operators: lists, kills or reconfigures.
    Admin,
    /// Refused by Redis inside scripts (permitd runs none).
    Noscript,
    /// May park the client until it is served or times out.
    Blocking,
    /// Allowed while the server loads its data.
    Loading,
    /// Allowed while a replica's data is stale.
    Stale,
    /// Left out of the slow log.
    SkipSlowlog,
    /// Constant or logarithmic, never parks.
    Fast,
    /// Runs before the client authenticates.
    NoAuth,
    /// Refused inside MULTI (the transaction is then discarded at EXEC).
    NoMulti,
    /// Allowed while Redis is busy running a script.
    AllowBusy,
    /// May add state: refused with `-OOM` past `--maxmemory`.
    DenyOom,
}

impl Flag {
    /// The spelling in `COMMAND INFO` and the docs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Flag::Write => "write",
            Flag::Readonly => "readonly",
            Flag::Admin => "admin",
            Flag::Noscript => "noscript",
            Flag::Blocking => "blocking",
            Flag::Loading => "loading",
            Flag::Stale => "stale",
            Flag::SkipSlowlog => "skip-slowlog",
            Flag::Fast => "fast",
            Flag::NoAuth => "no-auth",
            Flag::NoMulti => "no-multi",
            Flag::AllowBusy => "allow-busy",
            Flag::DenyOom => "denyoom",
        }
    }
}

listed_set! {
    /// A command's flags: bits for dispatch to test, the list for `COMMAND INFO` to show.
    Flags of Flag
}

/// An ACL category: what `+@category` / `-@category` rules allow or deny at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclCat {
    /// Reads state.
    Read,
    /// Changes state.
    Write,
    /// A namespace, semaphore or lease command.
    Semaphore,
    /// For operators.
    Admin,
    /// Constant or logarithmic.
    Fast,
    /// Not [`AclCat::Fast`].
    Slow,
    /// May park the client.
    Blocking,
    /// Destroys data, or shows or affects other clients.
    Dangerous,
    /// About the connection or the command set.
    Connection,
    /// MULTI, EXEC and DISCARD.
    Transaction,
}

impl AclCat {
    /// The spelling in `COMMAND INFO` and the docs, with its `@`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AclCat::Read => "@read",
            AclCat::Write => "@write",
            AclCat::Semaphore => "@semaphore",
            AclCat::Admin => "@admin",
            AclCat::Fast => "@fast",
            AclCat::Slow => "@slow",
            AclCat::Blocking => "@blocking",
            AclCat::Dangerous => "@dangerous",
            AclCat::Connection => "@connection",
            AclCat::Transaction => "@transaction",
        }
    }

    /// The name without `@`, as `ACL CAT` lists it and ACL rules take it after their `@`.
    pub fn name(self) -> &'static str {
        &self.as_str()[1..]
    }
}

listed_set! {
    /// A command's ACL categories: bits for ACL checks, the list for `COMMAND INFO` to show.
    AclCats of AclCat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_answer_membership_and_keep_their_order() {
        const F: Flags = Flags::of(&[Flag::Fast, Flag::Stale]);
        assert!(F.has(Flag::Fast) && F.has(Flag::Stale) && !F.has(Flag::Write));
        assert_eq!(F.iter().collect::<Vec<_>>(), [Flag::Fast, Flag::Stale]);
        assert!(Flags::of(&[]).is_empty() && !F.is_empty());
        const A: AclCats = AclCats::of(&[AclCat::Transaction, AclCat::Read]);
        assert!(A.has(AclCat::Transaction) && !A.has(AclCat::Write));
        assert_eq!(AclCat::Semaphore.name(), "semaphore");
    }

    #[test]
    #[should_panic(expected = "listed twice")]
    fn a_member_listed_twice_is_refused() {
        let twice: &'static [Flag] = &[Flag::Fast, Flag::Fast];
        Flags::of(twice);
    }
}
