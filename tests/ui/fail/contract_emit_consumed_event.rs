// payments.charge.succeeded is generated with `.consumes(["payments.>"])`: billing reads it,
// payments emits it.
use outbox_runtime::{EmitExt, Result};
use outbox_ui::contract_v2::ChargeSucceeded;

async fn echo(conn: &mut sqlx::PgConnection, charge: ChargeSucceeded) -> Result<()> {
    conn.emit(charge).await?;
    Ok(())
}

fn main() {
    let _ = echo;
}
