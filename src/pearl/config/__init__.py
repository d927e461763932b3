"""The programs' configurations: YAML files validated with pydantic, plus ``key=value``
overrides. One module per program's schema (``simulate``: ``pearl simulate`` and its RL
experiments; ``plan``; ``train``), ``loading`` the machinery they share: unknown keys are
errors that name the key and list the valid ones, secrets are redacted when written.
``pearl calibrate`` fits what ``plan`` runs and takes the same config. The worlds do not
import these: the programs turn them into what the worlds take (``pearl.apps.sim_build``)."""
