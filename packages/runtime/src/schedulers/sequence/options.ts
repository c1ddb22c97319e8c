/**
 * The sequence batcher's public shapes: what createSequenceBatcher is given (the config, the
 * model's own infer) and the SequenceBatcher it gives back.
 */
import type { ModelConfig } from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse } from "@trellis/stage";

export interface SequenceBatcherOptions {
  /** The model's config: sequence_batching says what to add; max_batch_size whether tensors carry a batch dim. */
  config: ModelConfig;
  /** `<repository>/<model>`: initial_state data files are read from its `initial_state` folder. */
  modelDir?: string;
  /** Model instances (default 1): each holds max(1, max_batch_size) sequence slots, or oldest's max_candidate_sequences. */
  instances?: number;
  /** Runs one request of a sequence, its control and state tensors added: the model's own infer. */
  run(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /**
   * Called for each request that fails before reaching `run` (refused, cancelled while it
   * waited, or the stage closed), with its time in ns: the stage counts it as a failed request.
   */
  onRefused?(elapsedNs: number): void;
}

export interface SequenceBatcher {
  infer(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /** Requests waiting for their sequence's previous request or for a slot (not yet handed to `run`). */
  readonly queued: number;
  /** Sequences holding a slot. */
  readonly active: number;
  /** Sequences waiting for a slot. */
  readonly backlogged: number;
  /** Fails waiting requests with UNAVAILABLE and stops the idle timers; requests already running finish. */
  close(): void;
}
