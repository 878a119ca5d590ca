"""Entry of one trainer pod of the indexed Job (trainers.yaml): TF_CONFIG from the completion index.

Every pod of the Job gets the same cluster, ``NUM_TRAINERS`` workers at ``TRAINER_ADDRESS`` with
``{index}`` replaced by 0, 1, ... (the pods' stable names under the headless Service), and its own
place in it, ``JOB_COMPLETION_INDEX``, which Kubernetes sets in each pod of an indexed Job. Then it
runs train.py beside it with the same arguments.
"""

import json
import os
import sys
from pathlib import Path

index = int(os.environ["JOB_COMPLETION_INDEX"])
trainers = int(os.environ["NUM_TRAINERS"])
if not 0 <= index < trainers:
    sys.exit(f"JOB_COMPLETION_INDEX {index} is not a trainer of {trainers}: make NUM_TRAINERS the Job's completions")
workers = [os.environ["TRAINER_ADDRESS"].format(index=i) for i in range(trainers)]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
print(f"trainer {index} of {trainers}: TF_CONFIG={os.environ['TF_CONFIG']}", flush=True)
train = Path(__file__).with_name("train.py")
os.execv(sys.executable, [sys.executable, str(train), *sys.argv[1:]])
