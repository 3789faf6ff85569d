# nanoGPT's small character-level Shakespeare model, for one GPU; train.py takes every
# setting it does not get from the command line from this file when it finds a GPU.
# About 3 minutes on an A100 in nanoGPT.
# python train.py config/train_shakespeare_char.py --residual=norm_gated_ihc
dataset = "shakespeare_char"
eval_interval = 250  # the model overfits this small dataset: evaluate often
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # keep the checkpoint with the best val loss
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # context of up to 256 previous characters
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
learning_rate = 1e-3  # a small network can take a high learning rate
max_iters = 5000  # lr_decay_iters follows it, min_lr is learning_rate / 10 (train.py)
beta2 = 0.99  # a bit larger: few tokens per iteration
warmup_iters = 100
compile = True  # the fast path: the Triton kernels (kernels auto on CUDA) in compiled Blocks
