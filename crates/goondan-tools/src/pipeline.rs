//! The onion: middleware layers around a core, each deciding whether and how
//! to call the next (spec 002 §6, GOONDAN_FACTS "Middleware").
//!
//! One generic mechanism serves the `turn`, `step` and `toolCall` pipelines.
//! A layer gets the context mutably and a [`Next`]; whatever it changes
//! before calling `next.run(ctx)` is seen by the inner layers and the core,
//! and it may rewrite the result on the way out or not call `next` at all.
//!
//! Layers are ordered by priority (lower is outer); equal priorities keep
//! registration order. With A(10), B(5), C(10) the order is
//! `B:pre, A:pre, C:pre, core, C:post, A:post, B:post`.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A boxed, sendable future, the return type of middleware and handlers.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One layer of a pipeline over context `C` producing `R`.
pub trait Middleware<C, R>: Send + Sync {
    /// Handles the context; call `next.run(ctx)` to go inward.
    fn handle<'a>(&'a self, ctx: &'a mut C, next: Next<'a, C, R>) -> BoxFuture<'a, R>;
}

/// A [`Middleware`] written as an `async fn`; [`async_layer`] makes it a
/// layer of a chain, its future boxed there once rather than in each layer.
///
/// ```ignore
/// impl AsyncMiddleware<StepContext, StepOutcome> for Layer {
///     async fn handle<'a>(&'a self, ctx: &'a mut StepContext, next: Next<'a, StepContext, StepOutcome>) -> StepOutcome {
///         next.run(ctx).await
///     }
/// }
/// chain.register("layer", 0, async_layer(Layer));
/// ```
pub trait AsyncMiddleware<C, R>: Send + Sync {
    /// Handles the context; call `next.run(ctx)` to go inward.
    fn handle<'a>(&'a self, ctx: &'a mut C, next: Next<'a, C, R>) -> impl Future<Output = R> + Send + 'a;
}

/// `middleware` as a layer of a chain.
pub fn async_layer<C, R, M>(middleware: M) -> Arc<dyn Middleware<C, R>>
where
    C: 'static,
    R: 'static,
    M: AsyncMiddleware<C, R> + 'static,
{
    Arc::new(AsyncLayer(middleware))
}

struct AsyncLayer<M>(M);

impl<C, R, M: AsyncMiddleware<C, R>> Middleware<C, R> for AsyncLayer<M> {
    fn handle<'a>(&'a self, ctx: &'a mut C, next: Next<'a, C, R>) -> BoxFuture<'a, R> {
        Box::pin(self.0.handle(ctx, next))
    }
}

/// The innermost step of a pipeline.
pub trait Core<C, R>: Send + Sync {
    /// Produces the result for the (possibly changed) context.
    fn run<'a>(&'a self, ctx: &'a mut C) -> BoxFuture<'a, R>;
}

/// Turns a panic of a layer (its name) or of the core (`None`) into a result.
pub type PanicHandler<'a, R> = &'a (dyn Fn(Option<&str>, String) -> R + Send + Sync);

/// The rest of the pipeline, handed to a layer. It is `Copy`: a layer may
/// run the rest more than once (a retry), and keeps its own context after
/// each run.
pub struct Next<'a, C, R> {
    layers: &'a [Layer<C, R>],
    core: &'a dyn Core<C, R>,
    on_panic: Option<PanicHandler<'a, R>>,
}

impl<C, R> Clone for Next<'_, C, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C, R> Copy for Next<'_, C, R> {}

impl<'a, C: Send + 'a, R: Send + 'a> Next<'a, C, R> {
    /// Runs the remaining layers and then the core. The context is borrowed
    /// only for the run: the layer may read and change it afterwards.
    #[inline]
    pub fn run<'b>(self, ctx: &'b mut C) -> BoxFuture<'b, R>
    where
        'a: 'b,
    {
        match self.on_panic {
            None => match self.layers.split_first() {
                Some((first, rest)) => {
                    first.middleware.handle(ctx, Next { layers: rest, core: self.core, on_panic: None })
                }
                None => self.core.run(ctx),
            },
            Some(on_panic) => self.run_guarded(ctx, on_panic),
        }
    }

    /// The `run_catching` path, kept out of line so that the plain path
    /// (every tool call) stays as small as it was.
    #[inline(never)]
    fn run_guarded<'b>(self, ctx: &'b mut C, on_panic: PanicHandler<'a, R>) -> BoxFuture<'b, R>
    where
        'a: 'b,
    {
        match self.layers.split_first() {
            Some((first, rest)) => Box::pin(async move {
                let next = Next { layers: rest, core: self.core, on_panic: Some(on_panic) };
                // The future is made inside the guard: a layer may panic
                // before it returns one.
                match CatchUnwind::new(async move { first.middleware.handle(ctx, next).await }).await {
                    Ok(result) => result,
                    Err(payload) => on_panic(Some(&first.name), panic_message(payload.as_ref())),
                }
            }),
            None => Box::pin(async move {
                match CatchUnwind::new(async move { self.core.run(ctx).await }).await {
                    Ok(result) => result,
                    Err(payload) => on_panic(None, panic_message(payload.as_ref())),
                }
            }),
        }
    }
}

struct Layer<C, R> {
    priority: i32,
    name: Arc<str>,
    middleware: Arc<dyn Middleware<C, R>>,
}

impl<C, R> Clone for Layer<C, R> {
    fn clone(&self) -> Self {
        Self { priority: self.priority, name: Arc::clone(&self.name), middleware: Arc::clone(&self.middleware) }
    }
}

/// An ordered list of middleware layers.
pub struct MiddlewareChain<C, R> {
    layers: Vec<Layer<C, R>>,
}

impl<C, R> Default for MiddlewareChain<C, R> {
    fn default() -> Self {
        Self { layers: Vec::new() }
    }
}

impl<C, R> Clone for MiddlewareChain<C, R> {
    fn clone(&self) -> Self {
        Self { layers: self.layers.clone() }
    }
}

impl<C, R> std::fmt::Debug for MiddlewareChain<C, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.layers.iter().map(|l| (l.priority, l.name.as_ref()))).finish()
    }
}

impl<C: Send, R: Send> MiddlewareChain<C, R> {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a layer. Lower `priority` runs further out; among equal
    /// priorities, earlier registrations run further out.
    pub fn register(&mut self, name: impl Into<Arc<str>>, priority: i32, middleware: Arc<dyn Middleware<C, R>>) {
        // Insert after every layer whose priority is <= this one, which keeps
        // registration order among equals.
        let at = self.layers.partition_point(|l| l.priority <= priority);
        self.layers.insert(at, Layer { priority, name: name.into(), middleware });
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when no layer is registered.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer names from outermost to innermost.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.layers.iter().map(|l| l.name.as_ref())
    }

    /// Runs the whole chain around `core`.
    pub fn run<'a>(&'a self, ctx: &'a mut C, core: &'a dyn Core<C, R>) -> BoxFuture<'a, R>
    where
        C: 'a,
        R: 'a,
    {
        Next { layers: &self.layers, core, on_panic: None }.run(ctx)
    }

    /// Runs the whole chain around `core`, turning a panic of any layer or
    /// of the core into `on_panic(layer name or None, message)` at the point
    /// where it happened: the layers outside it see an ordinary result.
    /// (The toolCall pipeline does not use this: the executor guards the
    /// whole chain at once, which costs less per call.)
    pub fn run_catching<'a>(
        &'a self,
        ctx: &'a mut C,
        core: &'a dyn Core<C, R>,
        on_panic: PanicHandler<'a, R>,
    ) -> BoxFuture<'a, R>
    where
        C: 'a,
        R: 'a,
    {
        Next { layers: &self.layers, core, on_panic: Some(on_panic) }.run(ctx)
    }
}

/// The message of a panic payload (`&str` or `String`), or a placeholder.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no panic message".to_owned())
}

pin_project_lite::pin_project! {
    /// A future that turns a panic while polling the inner future into an `Err`.
    pub struct CatchUnwind<F> {
        #[pin]
        inner: F,
    }
}

impl<F: Future> CatchUnwind<F> {
    /// Guards `inner`.
    pub fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// A middleware from a function returning a boxed future, for layers that
/// need no state: `from_fn(|ctx, next| Box::pin(async move { next.run(ctx).await }))`.
pub fn from_fn<C, R, F>(f: F) -> Arc<dyn Middleware<C, R>>
where
    C: Send + 'static,
    R: 'static,
    F: for<'a> Fn(&'a mut C, Next<'a, C, R>) -> BoxFuture<'a, R> + Send + Sync + 'static,
{
    Arc::new(FnMiddleware(f))
}

struct FnMiddleware<F>(F);

impl<C, R, F> Middleware<C, R> for FnMiddleware<F>
where
    F: for<'a> Fn(&'a mut C, Next<'a, C, R>) -> BoxFuture<'a, R> + Send + Sync,
{
    fn handle<'a>(&'a self, ctx: &'a mut C, next: Next<'a, C, R>) -> BoxFuture<'a, R> {
        (self.0)(ctx, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Trace(Mutex<Vec<String>>);

    struct Recording {
        label: &'static str,
        trace: Arc<Trace>,
    }

    impl Middleware<Vec<String>, String> for Recording {
        fn handle<'a>(
            &'a self,
            ctx: &'a mut Vec<String>,
            next: Next<'a, Vec<String>, String>,
        ) -> BoxFuture<'a, String> {
            Box::pin(async move {
                self.push(format!("{}:pre", self.label));
                ctx.push(self.label.to_owned());
                let out = next.run(ctx).await;
                self.push(format!("{}:post", self.label));
                format!("{out}+{}", self.label)
            })
        }
    }

    impl Recording {
        fn push(&self, entry: String) {
            if let Ok(mut guard) = self.trace.0.lock() {
                guard.push(entry);
            }
        }
    }

    struct JoinCore(Arc<Trace>);

    impl Core<Vec<String>, String> for JoinCore {
        fn run<'a>(&'a self, ctx: &'a mut Vec<String>) -> BoxFuture<'a, String> {
            Box::pin(async move {
                if let Ok(mut guard) = self.0.0.lock() {
                    guard.push("core".to_owned());
                }
                ctx.join(",")
            })
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map(|rt| rt.block_on(f))
            .unwrap_or_else(|e| panic!("runtime: {e}"))
    }

    #[test]
    fn priorities_order_layers_and_ties_keep_registration_order() {
        let trace = Arc::new(Trace(Mutex::new(Vec::new())));
        let mut chain = MiddlewareChain::new();
        for (label, priority) in [("A", 10), ("B", 5), ("C", 10)] {
            chain.register(label, priority, Arc::new(Recording { label, trace: Arc::clone(&trace) }));
        }
        assert_eq!(chain.names().collect::<Vec<_>>(), ["B", "A", "C"]);
        let core = JoinCore(Arc::clone(&trace));
        let mut ctx = Vec::new();
        let out = block_on(chain.run(&mut ctx, &core));
        let seen = trace.0.lock().map(|g| g.clone()).unwrap_or_default();
        assert_eq!(seen, ["B:pre", "A:pre", "C:pre", "core", "C:post", "A:post", "B:post"]);
        // The core saw every layer's change, in order; results were rewritten inside out.
        assert_eq!(out, "B,A,C+C+A+B");
    }

    #[test]
    fn a_layer_that_does_not_call_next_stops_everything_inside() {
        let trace = Arc::new(Trace(Mutex::new(Vec::new())));
        let mut chain: MiddlewareChain<Vec<String>, String> = MiddlewareChain::new();
        chain.register("outer", 0, Arc::new(Recording { label: "outer", trace: Arc::clone(&trace) }));
        chain.register("stop", 1, from_fn(|_ctx, _next| Box::pin(async { "short".to_owned() })));
        chain.register("inner", 2, Arc::new(Recording { label: "inner", trace: Arc::clone(&trace) }));
        let core = JoinCore(Arc::clone(&trace));
        let out = block_on(chain.run(&mut Vec::new(), &core));
        assert_eq!(out, "short+outer");
        let seen = trace.0.lock().map(|g| g.clone()).unwrap_or_default();
        assert_eq!(seen, ["outer:pre", "outer:post"]);
    }

    #[test]
    fn run_catching_names_the_layer_that_panicked_and_outer_layers_go_on() {
        let trace = Arc::new(Trace(Mutex::new(Vec::new())));
        let mut chain: MiddlewareChain<Vec<String>, String> = MiddlewareChain::new();
        chain.register("outer", 0, Arc::new(Recording { label: "outer", trace: Arc::clone(&trace) }));
        chain.register("boom", 1, from_fn(|_ctx, _next| panic!("layer exploded")));
        let core = JoinCore(Arc::clone(&trace));
        let on_panic = |layer: Option<&str>, message: String| format!("{layer:?}: {message}");
        let out = block_on(chain.run_catching(&mut Vec::new(), &core, &on_panic));
        assert_eq!(out, "Some(\"boom\"): layer exploded+outer");

        struct PanickingCore;
        impl Core<Vec<String>, String> for PanickingCore {
            fn run<'a>(&'a self, _ctx: &'a mut Vec<String>) -> BoxFuture<'a, String> {
                Box::pin(async { panic!("core exploded") })
            }
        }
        let plain: MiddlewareChain<Vec<String>, String> = MiddlewareChain::new();
        assert_eq!(block_on(plain.run_catching(&mut Vec::new(), &PanickingCore, &on_panic)), "None: core exploded");
    }

    #[test]
    fn a_layer_may_run_the_rest_again_and_read_its_context_afterwards() {
        let trace = Arc::new(Trace(Mutex::new(Vec::new())));
        let mut chain: MiddlewareChain<Vec<String>, String> = MiddlewareChain::new();
        chain.register(
            "retry",
            0,
            from_fn(|ctx: &mut Vec<String>, next| {
                Box::pin(async move {
                    let first = next.run(ctx).await;
                    ctx.push("again".to_owned());
                    let second = next.run(ctx).await;
                    format!("{first}|{second}|{}", ctx.len())
                })
            }),
        );
        chain.register("inner", 1, Arc::new(Recording { label: "inner", trace: Arc::clone(&trace) }));
        let out = block_on(chain.run(&mut vec!["x".to_owned()], &JoinCore(Arc::clone(&trace))));
        assert_eq!(out, "x,inner+inner|x,inner,again,inner+inner|4");
        let seen = trace.0.lock().map(|g| g.clone()).unwrap_or_default();
        assert_eq!(seen, ["inner:pre", "core", "inner:post", "inner:pre", "core", "inner:post"]);
    }

    #[test]
    fn empty_chain_runs_core() {
        let trace = Arc::new(Trace(Mutex::new(Vec::new())));
        let chain: MiddlewareChain<Vec<String>, String> = MiddlewareChain::new();
        let out = block_on(chain.run(&mut vec!["x".to_owned()], &JoinCore(trace)));
        assert_eq!(out, "x");
        assert!(chain.is_empty());
    }
}
