"""Scale-out on Ray Serve (`specrouter serve --ray`): engine replicas behind one ingress.

knowledge (what the replicas learn, pooled: acceptance estimates, live metrics, liveness),
affinity (which replica a request prefers), remote (the ingress's view of the replicas,
the surface the HTTP app serves from), replica (what one replica builds), deploy (the Ray
Serve application and the command). Only `affinity` and `deploy` import Ray.
"""
