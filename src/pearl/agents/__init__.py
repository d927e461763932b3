"""Agent programs as trajectories: an OpenAI-compatible endpoint in front of the router
(``endpoint``), each episode's calls as exact token sequences (``conversation``), the
agent run as an episode (``episode``) and chosen by ``env.name: agent`` (``plugin``)."""
