// v2 of billing.subscription.renewed dropped the `legacy` plan; this code was written for v1.
use outbox_ui::contract_v2::{SubscriptionRenewed, SubscriptionRenewedPlan};

fn renewed(subscription_id: uuid::Uuid) -> SubscriptionRenewed {
    SubscriptionRenewed {
        subscription_id,
        plan: SubscriptionRenewedPlan::Legacy,
        period: std::num::NonZeroU64::MIN,
    }
}

fn main() {
    let _ = renewed(uuid::Uuid::nil());
}
