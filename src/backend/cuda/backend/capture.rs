//! CUDA graph capture: the decode graphs per batch-size bucket and the mixed-step segment
//! graphs per token-count bucket.

use std::time::{Duration, Instant};

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use crate::engine::BackendError;

use crate::backend::cuda::graphs::StepGraph;
use crate::backend::cuda::inputs::{Padding, StepLayout, pack_step};
use crate::backend::cuda::plan;

use super::{CudaBackend, dev};

impl CudaBackend {
    /// Chooses the small-M product paths and, when `graphs`, captures the decode graphs (and,
    /// when `mixed` too, the mixed-step segment graphs), recording how long each took.
    pub(super) fn choose_and_capture(
        &mut self,
        graphs: bool,
        mixed: bool,
    ) -> Result<(), BackendError> {
        let choose_started = Instant::now();
        self.choose_small_m_products()?;
        self.phases.gemm_selection = choose_started.elapsed();
        tracing::info!(
            choose_ms = self.phases.gemm_selection.as_millis() as u64,
            "product paths chosen"
        );
        let capture_started = Instant::now();
        if graphs {
            self.capture_decode_graphs()?;
            tracing::info!(
                buckets = ?self.graphs.buckets(),
                capture_ms = capture_started.elapsed().as_millis() as u64,
                "decode graphs captured"
            );
            if mixed {
                let mixed_started = Instant::now();
                self.capture_mixed_step_graphs()?;
                tracing::info!(
                    buckets = ?self.mixed.buckets(),
                    capture_ms = mixed_started.elapsed().as_millis() as u64,
                    "mixed-step segment graphs captured"
                );
            }
        } else {
            tracing::info!("decode graphs off: every step runs eagerly");
        }
        self.phases.graphs = capture_started.elapsed();
        Ok(())
    }

    /// Records what `record` launches on the stream as a CUDA graph and instantiates it (`what`
    /// names the graph in an error). Returns the graph and when the recording ended; the time
    /// after that went to instantiation.
    pub(super) fn capture(
        &mut self,
        what: impl FnOnce() -> String,
        record: impl FnOnce(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(CudaGraph, Instant), BackendError> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(dev("beginning graph capture"))?;
        let recorded = record(self);
        let recorded_at = Instant::now();
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(dev("ending graph capture"));
        recorded?;
        let graph = graph?
            .ok_or_else(|| BackendError::Device(format!("capturing {}: empty graph", what())))?;
        Ok((graph, recorded_at))
    }

    /// Captures the decode forward pass for every batch-size bucket. Each bucket first runs
    /// once eagerly on padding inputs, so cuBLASLt plans its products and every module is
    /// loaded before capture; the graph is then uploaded so its first replay costs no set-up.
    fn capture_decode_graphs(&mut self) -> Result<(), BackendError> {
        // Where the time goes: eager warm-up, capture (recording and instantiation), upload.
        let mut took = [Duration::ZERO; 3];
        let planning_before = self.gemm.planning_time();
        for bucket in plan::graph_buckets(self.limits.max_rows) {
            let started = Instant::now();
            let layout = self.copy_padding_step(Padding::DecodeRows(bucket))?;
            let splits = self.decode_graph_splits(bucket);
            self.forward(&layout, splits)?;
            self.stream.synchronize().map_err(dev("graph warm-up"))?;
            let warmed = Instant::now();
            let (graph, _) = self.capture(
                || format!("the decode step of {bucket} rows"),
                |backend| backend.forward(&layout, splits),
            )?;
            let instantiated = Instant::now();
            let graph = StepGraph::new(graph);
            graph.upload().map_err(dev("uploading a graph"))?;
            self.graphs.push(bucket, graph);
            took[0] += warmed - started;
            took[1] += instantiated - warmed;
            took[2] += instantiated.elapsed();
        }
        self.stream.synchronize().map_err(dev("graph upload"))?;
        let [warm_up, capture, upload] = took.map(|d| d.as_millis() as u64);
        tracing::info!(
            warm_up_ms = warm_up,
            of_it_planning_ms = (self.gemm.planning_time() - planning_before).as_millis() as u64,
            capture_ms = capture,
            upload_ms = upload,
            "decode graphs: where the capture time went"
        );
        Ok(())
    }

    /// Captures the segments of the forward pass between attention launches (see `graphs.rs`)
    /// for every token-count bucket. Each bucket's products are first run once eagerly (segment
    /// 1 holds every product shape but the LM head's), so cuBLASLt plans them and loads their
    /// kernels before capture; each graph is uploaded after capture.
    fn capture_mixed_step_graphs(&mut self) -> Result<(), BackendError> {
        let layers = self.weights.layers.len();
        // Where the time goes: eager warm-up, recording the launches, instantiation, upload.
        let mut took = [Duration::ZERO; 4];
        let planning_before = self.gemm.planning_time();
        for bucket in plan::mixed_step_buckets(self.limits.max_tokens) {
            let started = Instant::now();
            let layout = self.copy_padding_step(Padding::Tokens(bucket))?;
            self.segment(&layout, 1)?;
            self.stream.synchronize().map_err(dev("graph warm-up"))?;
            took[0] += started.elapsed();
            let mut segments = Vec::with_capacity(layers + 1);
            for segment in 0..=layers {
                let started = Instant::now();
                let (graph, recorded) = self.capture(
                    || format!("segment {segment} of a {bucket}-token step"),
                    |backend| backend.segment(&layout, segment),
                )?;
                let instantiated = Instant::now();
                let graph = StepGraph::new(graph);
                graph.upload().map_err(dev("uploading a graph"))?;
                took[1] += recorded - started;
                took[2] += instantiated - recorded;
                took[3] += instantiated.elapsed();
                segments.push(graph);
            }
            self.mixed.push(bucket, segments);
        }
        self.stream.synchronize().map_err(dev("graph upload"))?;
        let [warm_up, record, instantiate, upload] = took.map(|d| d.as_millis() as u64);
        tracing::info!(
            warm_up_ms = warm_up,
            of_it_planning_ms = (self.gemm.planning_time() - planning_before).as_millis() as u64,
            record_ms = record,
            instantiate_ms = instantiate,
            upload_ms = upload,
            "mixed-step segment graphs: where the capture time went"
        );
        Ok(())
    }

    /// Packs a step of nothing but `padding` and copies it to the device (the inputs of a
    /// graph's warm-up and capture).
    pub(super) fn copy_padding_step(
        &mut self,
        padding: Padding,
    ) -> Result<StepLayout, BackendError> {
        let mut host = std::mem::take(&mut self.host_inputs);
        let layout = pack_step(&[], padding, &self.limits, &mut host);
        self.host_inputs = host;
        let layout = layout?;
        self.copy_inputs(0..layout.len())?;
        Ok(layout)
    }

    /// The split-K bound of the decode graph of `bucket` rows.
    fn decode_graph_splits(&self, bucket: usize) -> usize {
        self.split_bound(bucket, self.graph_split_context)
    }

    /// `plan::split_bound` for `tokens` query tokens whose longest context is `max_context`, on
    /// this model's KV heads, this backend's partial buffers and this device's wave of blocks.
    pub(super) fn split_bound(&self, tokens: usize, max_context: usize) -> usize {
        plan::split_bound(
            tokens,
            self.params.num_kv_heads,
            max_context,
            self.split_budget,
            self.attention_blocks,
        )
    }
}
