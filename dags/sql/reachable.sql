-- Nodes reachable from a root along edges (a root reaches itself), kept current as edges
-- come and go. The recursive CTE is a fixed-point loop: each epoch, Airflow's
-- loop_reachable_r.iterate runs one iteration per task until an iteration changes nothing.
CREATE VIEW reachable AS
  WITH RECURSIVE r(node) AS (
    SELECT node FROM roots
    UNION
    SELECT e.dst FROM r JOIN edges e ON e.src = r.node)
  SELECT node FROM r;
