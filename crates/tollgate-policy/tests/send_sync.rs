//! Compile-time check: the policy types can be shared across threads and tasks (a server parses
//! the file once and reads it from every request).

use tollgate_policy::{Condition, Descriptor, Hit, Limit, Policy, PolicyError, Variable};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn policy_types_are_send_and_sync() {
    assert_send_sync::<Policy>();
    assert_send_sync::<Limit>();
    assert_send_sync::<Condition>();
    assert_send_sync::<Variable>();
    assert_send_sync::<Descriptor>();
    assert_send_sync::<Hit<'static>>();
    assert_send_sync::<PolicyError>();
}
