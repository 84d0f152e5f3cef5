//! `outbox tail`: follow event types on the stream and print their envelopes.

use std::process::ExitCode;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;

use crate::args::TailArgs;
use crate::error::{CliError, Result};
use crate::{connect, render};

pub async fn run(args: TailArgs) -> Result<ExitCode> {
    let js = connect::jetstream(&args.nats).await?;
    let first = &args.event_types[0];
    let stream_name = match args.stream {
        Some(s) => s,
        None => js
            .stream_by_subject(first.clone())
            .await
            .map_err(|e| CliError::NoStream {
                event_type: first.clone(),
                source: e.into(),
            })?,
    };
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| CliError::stream(format!("cannot open stream `{stream_name}`"), e))?;
    let following = || format!("cannot follow `{stream_name}`");
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: args.event_types.clone(),
            deliver_policy: if args.all {
                DeliverPolicy::All
            } else {
                DeliverPolicy::New
            },
            ..Default::default()
        })
        .await
        .map_err(|e| CliError::stream(following(), e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| CliError::stream(following(), e))?;
    eprintln!(
        "following {} on stream {stream_name} (Ctrl-C to stop)",
        args.event_types.join(", ")
    );
    let mut seen = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let next = tokio::select! {
            _ = &mut ctrl_c => break,
            next = messages.next() => next,
        };
        let Some(message) = next else { break };
        let message = message.map_err(|e| CliError::stream("stream error", e))?;
        println!("{}", render::envelope(&message.subject, &message.payload));
        seen += 1;
        if args.count.is_some_and(|c| seen >= c) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
