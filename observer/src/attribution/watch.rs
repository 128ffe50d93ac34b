//! Keeping a cache filled from a kube-rs watcher, the same way for pods and
//! for Rollouts. A (re)list is collected and swapped in at its end, so
//! readers never see a half-listed cache and objects missing from the new
//! list are dropped.
//!
//! kube-rs' watcher resumes a dropped watch from the last resource version
//! without emitting anything when that works, so after an error there would
//! be no event to say the server is back. Each error therefore ends the
//! watcher, and after a wait a new one starts with a list: its completion
//! is the proof of health, and it also drops what was deleted during the
//! outage. The backoff is reset only by real progress, not by the `Init`
//! marker a new watcher emits before it has talked to the server, so a
//! server that keeps failing is retried ever more slowly, up to every 30 s.
use std::{fmt::Debug, time::Duration};

use futures::StreamExt;
use kube::{
    runtime::{
        utils::Backoff,
        watcher::{self, DefaultBackoff, Event},
    },
    Api, Resource,
};
use serde::de::DeserializeOwned;

/// A cache kept by [`run`]: how it takes each watched object, and what it
/// says when the server answers or fails.
pub trait Watched {
    type Object: Resource + Clone + DeserializeOwned + Debug + Send + 'static;
    /// What a list collects before it is swapped in whole.
    type Relist: Default;
    /// Whether a change applied, not only a completed list, shows that the
    /// server answers.
    const CHANGES_SHOW_HEALTH: bool;

    /// Whether anyone but the watch holds the cache; the watch ends when not.
    fn in_use(&self) -> bool;
    fn collect(&self, relist: &mut Self::Relist, object: &Self::Object);
    fn replace_all(&self, relist: Self::Relist);
    fn apply(&self, object: &Self::Object);
    fn delete(&self, object: &Self::Object);
    /// The server answered: a list completed, or a change where those count.
    fn answered(&self);
    /// The watch failed (`None`: its stream ended); how long to wait before
    /// the next list.
    fn failed(&self, error: Option<&watcher::Error>, retry: &mut Retry) -> Duration;
}

/// The pace of retries across outages, and whether this outage was
/// reported yet: one warning per outage, the retries at debug level.
#[derive(Default)]
pub struct Retry {
    backoff: DefaultBackoff,
    warned: bool,
}

impl Retry {
    /// The wait before the next try of a failure that may pass, and whether
    /// it is the first of its outage (the one to warn of).
    pub fn transient(&mut self) -> (Duration, bool) {
        let delay = self.backoff.next().unwrap_or(Duration::from_secs(30));
        let first = !self.warned;
        self.warned = true;
        (delay, first)
    }

    /// An answer that will not change soon, asked again at its own pace: the
    /// next transient failure is a new outage.
    pub fn settled(&mut self) {
        self.backoff.reset();
        self.warned = false;
    }
}

/// Folds watcher events into a cache.
pub struct Relister<C: Watched> {
    pub cache: C,
    relist: Option<C::Relist>,
}

impl<C: Watched> Relister<C> {
    pub fn new(cache: C) -> Self {
        Self { cache, relist: None }
    }

    /// Applies one event; true when it shows the server answers (see
    /// [`Watched::CHANGES_SHOW_HEALTH`]). `Init` is emitted before any
    /// request, and a list is only known to succeed at its end.
    pub fn apply(&mut self, event: Event<C::Object>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(C::Relist::default());
                false
            }
            Event::InitApply(object) => {
                if let Some(relist) = self.relist.as_mut() {
                    self.cache.collect(relist, &object);
                }
                false
            }
            Event::InitDone => {
                // Without a preceding Init there is nothing to swap in; that
                // cannot happen with kube-rs' watcher, but an empty swap
                // would wipe the cache.
                if let Some(relist) = self.relist.take() {
                    self.cache.replace_all(relist);
                }
                true
            }
            Event::Apply(object) => {
                self.cache.apply(&object);
                C::CHANGES_SHOW_HEALTH
            }
            Event::Delete(object) => {
                self.cache.delete(&object);
                C::CHANGES_SHOW_HEALTH
            }
        }
    }
}

/// Watches until no cache handle is left: `upgrade` gives the cache for
/// each new watcher, or `None` once every reader has let it go.
pub async fn run<C: Watched>(api: Api<C::Object>, config: watcher::Config, upgrade: impl Fn() -> Option<C>) {
    let mut retry = Retry::default();
    loop {
        let Some(cache) = upgrade() else { return };
        let mut relister = Relister::new(cache);
        let mut stream = watcher::watcher(api.clone(), config.clone()).boxed();
        let error = loop {
            match stream.next().await {
                Some(Ok(event)) => {
                    if !relister.cache.in_use() {
                        return;
                    }
                    if relister.apply(event) {
                        retry.settled();
                        relister.cache.answered();
                    }
                }
                Some(Err(err)) => break Some(err),
                // The watcher stream never ends; if it did, start over.
                None => break None,
            }
        };
        drop(stream);
        let delay = relister.cache.failed(error.as_ref(), &mut retry);
        // No handle is held while waiting, so dropping the last one ends
        // this task at the next wake-up.
        drop(relister);
        tokio::time::sleep(delay).await;
    }
}
